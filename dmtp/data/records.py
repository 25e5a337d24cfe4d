"""Turning raw records into (input_ids, loss_mask): plain text, or conversations rendered with the
target's chat template and an assistant-only loss mask."""
from __future__ import annotations

CONVERSATION_KEYS = ("messages", "conversations", "conversation")
ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
                "model": "assistant", "system": "system"}


def normalise_messages(raw: list) -> list[dict]:
    messages = []
    for m in raw:
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        if role not in ROLE_ALIASES or content is None:
            raise ValueError(f"unrecognised message {str(m)[:80]!r}: expected role/content or from/value")
        messages.append({"role": ROLE_ALIASES[role], "content": str(content)})
    return messages


def _render(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Tokens of the whole conversation and a mask that is 1 exactly on assistant replies (including
    their end-of-turn marker), found by rendering growing prefixes of the conversation."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("conversation data needs a tokenizer with a chat template")
    ids = _render(tokenizer, messages, add_generation_prompt=False)
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:i], add_generation_prompt=True))
        end = len(_render(tokenizer, messages[: i + 1], add_generation_prompt=False))
        for j in range(start, min(end, len(ids))):
            mask[j] = 1
    return ids, mask


def encode_record(tokenizer, record: dict, text_key: str = "text") -> tuple[list[int], list[int]]:
    for key in CONVERSATION_KEYS:
        if key in record and isinstance(record[key], list):
            return encode_conversation(tokenizer, normalise_messages(record[key]))
    if text_key in record:
        ids = tokenizer(str(record[text_key]), add_special_tokens=False)["input_ids"]
        return ids, [1] * len(ids)
    raise ValueError(f"record has neither {text_key!r} nor a conversation ({', '.join(CONVERSATION_KEYS)}): "
                     f"keys {sorted(record)[:8]}")
