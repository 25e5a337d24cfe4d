"""The one decoding loop: lossless greedy decoding for every method, stub proposers with known
acceptance, KV rollback, and the loop's drafter/MTP state against a teacher-forced recomputation."""
import pytest
import torch

from dmtp.data.corpora import documents
from dmtp.decode import DrafterProposer, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for
from scripted_proposer import ScriptedProposer
from dmtp.injection import VARIANTS
from dmtp.models.target import load_tokenizer

MAX_NEW = 32


@pytest.fixture(scope="module")
def tokenizer(micro_target_dir):
    return load_tokenizer(micro_target_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Held-out (test split) prompts of every domain, of different lengths."""
    out = []
    for domain in ("code", "prose", "math"):
        for j, doc in enumerate(documents(domain, "test")[:3 if domain != "math" else 2]):
            ids = tokenizer(doc.text[:400], add_special_tokens=False)["input_ids"]
            out.append(ids[: 6 + 5 * j + len(out)])
    return out


def greedy_reference(target, prompt, n):
    """The target's own greedy decoding: transformers' forward with its own KV cache, one token a step."""
    out_ids = []
    with torch.no_grad():
        out = target.hf(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            nxt = int(out.logits[0, -1].argmax())
            out_ids.append(nxt)
            past = out["cache"] if "cache" in out else out["past_key_values"]  # transformers >= 5.2x / older
            kw = {"cache": past} if "cache" in out else {"past_key_values": past}
            out = target.hf(input_ids=torch.tensor([[nxt]]), use_cache=True, **kw)
    return out_ids


@pytest.fixture(scope="module")
def continuations(micro_target, prompts):
    """Greedy continuations without EOS (MAX_NEW + 8 tokens, so scripted proposals never run out)."""
    return [greedy_reference(micro_target, p, MAX_NEW + 8) for p in prompts]


@pytest.fixture(scope="module")
def eos_and_refs(continuations):
    """A stop token that ends some requests early (at different points) while others hit the budget,
    and the matching greedy references (cut after the first stop token)."""
    best, best_score = None, None
    for tok in {t for c in continuations for t in c[:MAX_NEW]}:
        firsts = [c[:MAX_NEW].index(tok) for c in continuations if tok in c[:MAX_NEW]]
        hits = len(firsts)
        if 0 < hits < len(continuations):
            score = (min(hits, len(continuations) - hits), len(set(firsts)))
            if best_score is None or score > best_score:
                best, best_score = tok, score
    refs = []
    for c in continuations:
        c = c[:MAX_NEW]
        refs.append(c[: c.index(best) + 1] if best in c else c)
    return best, refs


def make_drafter(target, name, seed=0, perturb=False):
    return fresh_drafter_for(target, name, 3, seed=seed, perturb=0.05 if perturb else 0.0)  # <|mask|> = 3


def test_mask_token_id(tokenizer):
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == 3


def _decoder(target, mtp, method, eos):
    if method in VARIANTS:
        drafter = make_drafter(target, method)
        proposer = build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=method)
    else:
        proposer = build_proposer(method, target, mtp=mtp)
    return spec_decoder(target, proposer, eos_token_id=eos)


LOSSLESS_CASES = [(m, b) for m in ("ar", "mtp415", *VARIANTS) for b in (1, 2, 4, 8)]


@pytest.mark.parametrize("method,batch", LOSSLESS_CASES)
def test_greedy_is_lossless(micro_target, micro_mtp, prompts, eos_and_refs, method, batch):
    eos, refs = eos_and_refs
    dec = _decoder(micro_target, micro_mtp, method, eos)
    res = dec.generate(prompts, max_new_tokens=MAX_NEW, batch_size=batch)
    assert res.tokens == refs
    ends = {"eos": sum(r[-1] == eos for r in refs), "budget": sum(len(r) == MAX_NEW for r in refs)}
    assert ends["eos"] > 0 and ends["budget"] > 0
    k = dec.num_candidates
    for toks, acc in zip(res.tokens, res.accepted):
        assert all(0 <= a <= k for a in acc)
        assert 1 + sum(a + 1 for a in acc) == len(toks)  # the prefill token + every committed round
    if method == "mtp415":
        assert any(a > 0 for acc in res.accepted for a in acc)


def test_recompute_runner_is_lossless(micro_target, micro_mtp, prompts, eos_and_refs):
    eos, refs = eos_and_refs
    drafter = make_drafter(micro_target, "dual_anchor_zero_init")
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    dec = spec_decoder(micro_target, proposer, eos_token_id=eos, runner="recompute")
    assert dec.runner.kind == "recompute"
    assert dec.generate(prompts[:4], max_new_tokens=MAX_NEW, batch_size=2).tokens == refs[:4]


# -- stub proposers with known acceptance ---------------------------------------------------------------

def _scripted(target, continuations, **kw):
    proposer = ScriptedProposer(continuations, 7, vocab_size=target.config.vocab_size, **kw)
    return spec_decoder(target, proposer, eos_token_id=[])


@pytest.mark.parametrize("batch", [1, 4])
def test_always_accept_emits_eight_per_round(micro_target, prompts, continuations, batch):
    n = 1 + 8 * 4
    res = _scripted(micro_target, continuations).generate(prompts, max_new_tokens=n, batch_size=batch)
    assert res.tokens == [c[:n] for c in continuations]
    assert res.accepted == [[7, 7, 7, 7]] * len(prompts)
    s = res.summary()
    assert s["tau_per_verify"] == 8.0 and s["tau_per_request"] == 8.0 and s["t1_accept"] == 1.0
    assert s["accept_hist"] == [0] * 7 + [4 * len(prompts)]
    assert s["p_len_ge"] == [1.0] * 7


def test_never_accept_emits_one_per_round(micro_target, prompts, continuations):
    res = _scripted(micro_target, continuations, corrupt_at=1).generate(prompts, max_new_tokens=20, batch_size=4)
    assert res.tokens == [c[:20] for c in continuations]
    assert res.accepted == [[0] * 19] * len(prompts)
    s = res.summary()
    assert s["tau_per_verify"] == 1.0 and s["t1_accept"] == 0.0


@pytest.mark.parametrize("k", [1, 3, 6])
def test_accepts_exactly_k(micro_target, prompts, continuations, k):
    n = MAX_NEW
    res = _scripted(micro_target, continuations, corrupt_at=k + 1).generate(prompts, max_new_tokens=n, batch_size=4)
    assert res.tokens == [c[:n] for c in continuations]
    for acc in res.accepted:
        assert acc[:-1] == [k] * (len(acc) - 1)
        assert acc[-1] == min(k, n - 1 - (k + 1) * (len(acc) - 1) - 1)
    hist = res.summary()["accept_hist"]
    assert hist[k] == sum(len(a) - 1 for a in res.accepted) + sum(a[-1] == k for a in res.accepted)


def test_kv_rollback_after_rejected_rounds(micro_target, prompts, continuations):
    """Every candidate of the first 6 rounds is wrong (their K/V rows are written, then rolled back
    by not advancing); afterwards the proposals are right. The output stays exact."""
    n = 6 + 1 + 8 * 3
    res = _scripted(micro_target, continuations, reject_first_rounds=6).generate(prompts, max_new_tokens=n, batch_size=4)
    assert res.tokens == [c[:n] for c in continuations]
    assert res.accepted == [[0] * 6 + [7, 7, 7]] * len(prompts)


def test_finished_requests_stop_advancing(micro_target, prompts, continuations):
    """Requests that end at different rounds (EOS at different places) in one batch."""
    eos = continuations[0][3]  # request 0 stops after 4 tokens; others whenever this token appears
    refs = [c[: c[:MAX_NEW].index(eos) + 1] if eos in c[:MAX_NEW] else c[:MAX_NEW] for c in continuations]
    dec = spec_decoder(micro_target, ScriptedProposer(continuations, 7, vocab_size=micro_target.config.vocab_size),
                      eos_token_id=eos)
    res = dec.generate(prompts, max_new_tokens=MAX_NEW, batch_size=len(prompts))
    assert res.tokens == refs
    assert len(res.accepted[0]) == 1 and res.accepted[0] == [2]


# -- the loop's incremental state == a teacher-forced recomputation -------------------------------------

class _Recording(DrafterProposer):
    def propose_stages(self, st):
        stages = super().propose_stages(st)
        inner = self.dstate.draft
        self.log = getattr(self, "log", [])

        def draft(anchor, anchor_pos, mtp, sampler, span=None):
            def recording(logits):  # a DFlash v1 drafter scores the whole vocabulary once per block
                self.log.append((anchor_pos.clone(), self.t1.clone(), logits[:, 0].clone(), st.done.clone()))
                return sampler(logits)
            return inner(anchor, anchor_pos, mtp, recording, span)

        self.dstate.draft = draft
        return stages


def _teacher_forced_logits(target, mtp, drafter, seq, a):
    """Drafter logits at anchor a from one teacher-forced pass over the final sequence."""
    injection = drafter.injection
    ids = torch.tensor([seq])
    layer_ids = drafter.config.target_layer_ids
    out = target(ids, layer_ids=layer_ids)
    g = mtp.forward_teacher(ids, out.last_hidden)
    ctx = injection.context_features(out.layer_hidden, g)
    ctx_pos = torch.arange(len(seq))[None]
    ctx_kv = drafter.context_kv(drafter.project_context(ctx), ctx_pos)
    h = g[:, a]
    t1 = mtp.logits(h).argmax(-1) if injection.uses_mtp else None
    embed = lambda x: drafter.embed(x, target.embed_tokens.weight)  # noqa: E731
    slots = injection.build_slots(embed, ids[:, a], t1, h if injection.uses_mtp else None)
    positions = injection.slot_positions(torch.tensor([a]))
    limit = torch.full_like(positions, a)
    hidden = drafter(slots, positions, ctx_kv, ctx_pos, limit, torch.zeros_like(positions))
    logits = drafter.logits(hidden[:, injection.first_predicted_slot:], target.lm_head.weight)
    return t1, logits[0]


@pytest.mark.parametrize("name", ["dual_anchor_zero_init", "context_fusion", "mtp_context_only", "raw_dflash"])
def test_drafter_state_matches_teacher_forcing(micro_target, micro_mtp, prompts, name):
    drafter = make_drafter(micro_target, name, perturb=True)
    proposer = _Recording(drafter, micro_target.embed_tokens.weight, micro_target.lm_head.weight,
                          mtp=micro_mtp)
    dec = spec_decoder(micro_target, proposer, eos_token_id=[])
    batch = [prompts[0], prompts[4], prompts[7]]
    res = dec.generate(batch, max_new_tokens=20, batch_size=3)
    checked = 0
    with torch.no_grad():
        for anchor_pos, t1, logits, done in proposer.log[::3]:
            for b, p in enumerate(batch):
                if done[b]:
                    continue
                seq = p + res.tokens[b]
                a = int(anchor_pos[b])
                tf_t1, tf_logits = _teacher_forced_logits(micro_target, micro_mtp, drafter, seq, a)
                if tf_t1 is not None:
                    assert int(t1[b]) == int(tf_t1)
                torch.testing.assert_close(logits[b], tf_logits, atol=1e-4, rtol=1e-4)
                checked += 1
    assert checked >= 6


def test_mtp_chain_first_candidate_matches_teacher_forcing(micro_target, micro_mtp, prompts):
    """Round r accepts T1 iff the teacher-forced MTP prediction at its anchor equals the next token."""
    dec = spec_decoder(micro_target, build_proposer("mtp415", micro_target, mtp=micro_mtp), eos_token_id=[])
    res = dec.generate(prompts, max_new_tokens=24, batch_size=4)
    with torch.no_grad():
        for p, toks, acc in zip(prompts, res.tokens, res.accepted):
            ids = torch.tensor([p + toks])
            g = micro_mtp.forward_teacher(ids, micro_target(ids).last_hidden)
            t1 = micro_mtp.logits(g).argmax(-1)[0]
            a = len(p)
            for k in acc[:-1]:  # the last round may be cut by the budget
                assert (k > 0) == bool(t1[a] == ids[0, a + 1])
                a += k + 1


# -- the eager loop's live span of the caches ------------------------------------------------------------

def _check_positions_below_span(dec, seen, monkeypatch):
    """Wrap every stage's cache access: each position read or written must lie below the round's span."""
    def check(positions, what):
        span = dec.runner.span
        if span is not None:
            seen.append((what, int(positions.max()), span))
            assert int(positions.max()) < span, (what, int(positions.max()), span)

    verify = dec.runner.verify
    monkeypatch.setattr(dec.runner, "verify", lambda tokens, positions=None: (check(positions, "target"),
                                                                              verify(tokens, positions))[1])
    m = dec.proposer.mtp_state
    if m is not None:   # the MTP module is shared by the tests: wrap its class's method on this instance
        rows = type(m.mtp).forward_rows.__get__(m.mtp)
        monkeypatch.setattr(m.mtp, "forward_rows", lambda t, h, positions, cache, span=None: (
            check(positions, "mtp"), rows(t, h, positions, cache, span))[1])
    d = getattr(dec.proposer, "dstate", None)
    if d is not None:   # the drafter reads context strictly before the anchor, writes its block's rows after it
        draft = d.draft
        monkeypatch.setattr(d, "draft", lambda anchor, anchor_pos, mtp, sampler, span=None: (
            check(d.injection.slot_positions(anchor_pos), "drafter"), draft(anchor, anchor_pos, mtp, sampler, span))[1])


@pytest.mark.parametrize("method", ["mtp415", "dual_anchor_zero_init", "context_fusion"])
def test_live_span_covers_every_row(micro_target, micro_mtp, prompts, eos_and_refs, method, monkeypatch):
    """The eager loop attends over the caches' live span only. With no rounding slack (SPAN_STEP 1), every
    row the target, the MTP and the drafter touch lies below the span, and the loop decodes exactly as
    over the whole caches: the target's tokens and the same drafts (accepted lengths)."""
    import dmtp.decode.loop as loop

    eos, refs = eos_and_refs
    runs, tight = {}, {}
    for step in (1, 10 ** 6):   # the tightest span; a span that always covers the whole cache
        monkeypatch.setattr(loop, "SPAN_STEP", step)
        dec = _decoder(micro_target, micro_mtp, method, eos)
        seen = []
        _check_positions_below_span(dec, seen, monkeypatch)
        runs[step] = dec.generate(prompts, max_new_tokens=MAX_NEW, batch_size=4)
        assert runs[step].tokens == refs
        tight[step] = [(what, pos, span) for what, pos, span in seen if span < dec.st.max_len]
    assert not tight[10 ** 6] and {what for what, _, _ in tight[1]} >= {"target", "mtp"}
    assert any(pos == span - 1 for _, pos, span in tight[1])   # the bound is tight: no slack hides an off-by-one
    assert runs[1].accepted == runs[10 ** 6].accepted
