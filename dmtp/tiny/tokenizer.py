"""A byte-level BPE tokenizer trained on the embedded corpora, saved in the Hugging Face layout."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
MASK = "<|mask|>"          # reserved for block drafters; never produced by the target's data
THINK, END_THINK = "<think>", "</think>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END, MASK, THINK, END_THINK]

# Qwen-style ChatML. `enable_thinking=False` pre-fills an empty think block, as Qwen3 templates do.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, mask_token=MASK,
                                   additional_special_tokens=[IM_START, IM_END, THINK, END_THINK])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast
