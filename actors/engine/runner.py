"""The model runner: turns one scheduled step into tensors, runs the model over the paged KV cache, samples, and
(with an MTP head) verifies the previous draft by rejection sampling and proposes the next one.

Speculative decoding with one MTP module: a decode step feeds [last token, draft]. The draft d ~ q is accepted
with probability min(1, p(d) / q(d)), else a token is drawn from normalise(max(0, p - q)); after an accepted draft
a bonus token is drawn from the next position's p. Every emitted token is thus distributed exactly as without
speculation, and the log-probability recorded for it is log p, the policy's distribution it follows.

The MTP layer's KV for hidden position i is stored at slot i + 1: it depends on h_i and token i + 1, i.e. on the
prefix up to i + 1 only, so it is cached and shared with the main KV by the same block hashes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from forge.actors.backend import TopTokens
from forge.actors.engine.cpu_kernels import load as load_cpu_kernels
from forge.actors.engine.graph import CompiledDecode
from forge.actors.engine.packed_linear import Pack, pack_linears
from forge.actors.engine.paged_attention import PagedAttention, PagedKVCache, StepLayout
from forge.actors.engine.sequence import ACCEPT, DRAFT, RESIDUAL, SAMPLE, Draft, Sequence, uniforms
from forge.model.moe import Routing
from forge.model.qwen3 import CausalLM
from forge.sampling.grammar import GrammarError
from forge.sampling.logit_edits import LogitEdits
from forge.sampling.sampling import batched_sampling_logprobs, top_logprobs

PreparedWeights = dict[int, Pack] | None

SCORE_ROWS = 256            # positions a scoring request's log-probs are computed for at once


@dataclass
class Work:
    """Feed positions [start, end) of ``seq`` (plus its draft when ``end`` reaches its last token); write KV for
    positions >= ``write_from`` (earlier ones are already cached and only recomputed for their hidden state)."""

    seq: Sequence
    start: int
    end: int
    write_from: int

    @property
    def samples(self) -> bool:
        return self.end == len(self.seq.token_ids) and not self.seq.score_from

    @property
    def draft(self) -> Draft | None:
        return self.seq.draft if self.samples else None


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    draft_accepted: bool | None = None
    top: list[TopTokens] | None = None      # per token, when the request asks for its top log-probs


@dataclass
class _Row:
    block_table: list[int]
    slots: list[int]          # slot position of each query (its token position, or i + 1 in the MTP layer)
    rope: list[int]           # rotary position of each query
    write_from: int


class ModelRunner:
    def __init__(self, model: CausalLM, cache: PagedKVCache, speculative: bool, cpu_kernels: bool = True,
                 compile_decode: bool = False, packed_linear: bool = True) -> None:
        self.model = model
        self.cache = cache
        self.block_size = cache.block_size
        self.device = model.output_weight.device
        self.speculative = speculative and len(model.mtp) > 0
        native = cpu_kernels and self.device.type == "cpu" and cache.keys.dtype == torch.float32
        self.kernel = load_cpu_kernels() if native else None
        self.records_routing = cache.routing is not None
        self.compiled = CompiledDecode(model, cache, self.kernel is not None) if compile_decode else None
        self.packs = pack_linears(model) if packed_linear else None
        # the named adapters' output-head term (``ServedAdapters.head_delta``), set by the engine
        self.head_adapters: Callable[[Tensor, list[str]], Tensor | None] | None = None

    def prepare_weights(self, state_dict: Mapping[str, torch.Tensor]) -> PreparedWeights:
        """What is derived from a weight version, made before it is applied, off the engine's thread."""
        return self.packs.packs_of(state_dict) if self.packs is not None else None

    def weights_changed(self, prepared: PreparedWeights = None) -> None:
        """Bring what is derived from the weights up to date after they were written in place (between steps):
        ``prepared`` (from ``prepare_weights`` of the same tensors) where given, else made from the model's."""
        if self.packs is not None:
            if prepared is not None:
                self.packs.install(prepared)
            else:
                self.packs.repack()

    def _layout(self, rows: list[_Row], width: int, key_lower: int) -> StepLayout:
        size = self.block_size
        num_blocks = -(-(max(max(r.slots) for r in rows) + 1) // size)
        write_rows, write_slots, query_slots, tables = [], [], [], []      # flat: one conversion each
        for b, row in enumerate(rows):
            table = row.block_table
            for t, pos in enumerate(row.slots):
                if pos >= row.write_from:
                    write_rows.append(b * width + t)
                    write_slots.append(table[pos // size] * size + pos % size)
            query_slots += row.slots
            query_slots += [key_lower] * (width - len(row.slots))
            tables += table[:num_blocks]
            tables += [table[0]] * (num_blocks - len(table))
        return StepLayout(self._tensor(write_rows), self._tensor(write_slots),
                          self._tensor(tables).view(len(rows), num_blocks),
                          self._tensor(query_slots).view(len(rows), width), key_lower, size)

    def _tensor(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _padded(self, values: list[list[int]], width: int) -> Tensor:
        flat = []
        for v in values:
            flat += v
            flat += [0] * (width - len(v))
        return self._tensor(flat).view(len(values), width)

    @torch.inference_mode()
    def run(self, work: list[Work]) -> list[Sampled | None]:
        """One forward pass over ``work``; returns, per item, the tokens sampled (None for a partial prefill)."""
        with self.packs.active() if self.packs is not None else nullcontext():
            return self._run(work)

    def _run(self, work: list[Work]) -> list[Sampled | None]:
        model = self.model
        drafts = [item.draft for item in work]
        fed = []
        for item, draft in zip(work, drafts, strict=True):
            tokens = item.seq.token_ids[item.start:item.end]
            if draft is not None:
                tokens = [*tokens, draft.token]
            fed.append(tokens)
        width = max(len(t) for t in fed)
        rows = []
        for item, tokens in zip(work, fed, strict=True):
            positions = list(range(item.start, item.start + len(tokens)))
            rows.append(_Row(item.seq.block_table, positions, positions, item.write_from))
        layout = self._layout(rows, width, key_lower=0)
        input_ids, position_ids = self._padded(fed, width), self._padded([r.rope for r in rows], width)
        if self.compiled is not None and width == 1:
            hidden, chosen = self.compiled(input_ids, position_ids, layout)
        else:
            routing = Routing(record=True) if self.records_routing else None
            hidden = model(input_ids, position_ids, PagedAttention(self.cache, layout, self.kernel), routing)
            chosen = routing.stack() if routing is not None else None
        if chosen is not None:
            self.cache.store_routing(layout, chosen)
        flat = hidden.reshape(-1, hidden.shape[-1])
        self._score(work, flat, width)

        logit_rows, owners = [], []
        for b, item in enumerate(work):
            if item.samples:
                last = b * width + item.end - 1 - item.start
                logit_rows.extend([last, last + 1] if drafts[b] is not None else [last])
                owners.append(b)
        results: list[Sampled | None] = [None] * len(work)
        if logit_rows:
            # Each logit row with the sequence it samples for and how many of its tokens come before it.
            row_seqs = [(work[b].seq, ahead) for b in owners for ahead in range(2 if drafts[b] is not None else 1)]
            # Increasing and distinct: as many as the rows means every row, in order.
            picked_rows = flat if len(logit_rows) == flat.shape[0] else flat[self._tensor(logit_rows)]
            logprobs = self._sampling_logprobs(self._logits(picked_rows, row_seqs), [s.params for s, _ in row_seqs],
                                               self._edits(row_seqs))
            plain, drafted, cursor = [], [], 0
            for b in owners:
                (plain if drafts[b] is None else drafted).append((b, cursor))
                cursor += 1 if drafts[b] is None else 2
            if plain:
                rows = [c for _, c in plain]
                chosen = logprobs if len(rows) == logprobs.shape[0] else logprobs[rows]
                seqs = [work[b].seq for b, _ in plain]
                tokens = self._draw(chosen, uniforms(seqs, 0, SAMPLE), seqs)
                picked = chosen.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
                tops = self._tops(chosen, seqs)
                for i, ((b, _), token, logprob) in enumerate(zip(plain, tokens.tolist(), picked.tolist(),
                                                                 strict=True)):
                    forced = work[b].seq.forced          # a continuation: another actor drew its first token
                    if forced is not None:
                        token, logprob = forced
                    results[b] = Sampled([token], [logprob], top=None if tops is None else [tops[i]])
            if drafted:
                for (b, _), result in zip(drafted, self._verify(logprobs, drafted, work), strict=True):
                    results[b] = result
        for item, result in zip(work, results, strict=True):
            if result is not None:
                _truncate(result, item.seq)
            accepted = result is not None and result.draft_accepted
            item.seq.num_computed = item.end + (1 if accepted else 0)
        if self.speculative:
            self._mtp_pass(work, results, flat, width)
        return results

    def _score(self, work: list[Work], flat: Tensor, width: int) -> None:
        """Append to each scoring sequence the log-probability, under the model's own distribution (no temperature,
        no edits), of every token this step's positions predict that it has not scored yet (a preempted request
        recomputes positions it scored before)."""
        rows, targets, owners = [], [], []
        for b, item in enumerate(work):
            seq = item.seq
            if not seq.score_from:
                continue
            for position in range(max(item.start, seq.score_from - 1 + len(seq.scores)),
                                  min(item.end, len(seq.token_ids) - 1)):
                rows.append(b * width + position - item.start)
                targets.append(seq.token_ids[position + 1])
                owners.append(seq)
        for first in range(0, len(rows), SCORE_ROWS):      # [rows, vocab] logits at a time: bounded memory
            picked = slice(first, first + SCORE_ROWS)
            seqs = owners[picked]
            logits = self._logits(flat[self._tensor(rows[picked])], [(seq, 0) for seq in seqs]).float()
            chosen = torch.log_softmax(logits, dim=-1).gather(-1, self._tensor(targets[picked]).unsqueeze(-1))
            for seq, value in zip(seqs, chosen.squeeze(-1).tolist(), strict=True):
                seq.scores.append(value)

    def _logits(self, rows: Tensor, row_seqs: list[tuple[Sequence, int]]) -> Tensor:
        """The logits of hidden ``rows``, each with its sequence's adapter's output-head term when it has one."""
        logits = self.model.logits(rows)
        if self.head_adapters is not None:
            delta = self.head_adapters(self.model.model.norm(rows), [seq.adapter for seq, _ in row_seqs])
            if delta is not None:
                logits = logits + delta.to(logits.dtype)
        return logits

    def _sampling_logprobs(self, logits: Tensor, params: list, edits: LogitEdits | None = None) -> Tensor:
        device, vocab = logits.device, logits.shape[-1]
        truncates = (any(0 < p.top_k < vocab for p in params), any(p.top_p < 1.0 for p in params))
        return batched_sampling_logprobs(
            logits,
            torch.tensor([p.temperature for p in params], device=device),
            torch.tensor([p.top_k for p in params], device=device),
            torch.tensor([p.top_p for p in params], device=device),
            truncates,
            edits,
        )

    @staticmethod
    def _edits(row_seqs: list[tuple[Sequence, int]]) -> LogitEdits | None:
        """The edits of each row's logits (see ``forge.sampling.logit_edits``): a row samples the output ``ahead``
        outputs after the ones its sequence has."""
        rows = []
        for row, (seq, ahead) in enumerate(row_seqs):
            try:
                edits = seq.current_edits()
                edit = edits.row(ahead) if edits is not None else None
            except GrammarError as exc:     # this sequence's grammar failed: it alone ends (the step finishes it)
                seq.failure = f"the grammar failed at output token {seq.num_output}: {str(exc).splitlines()[0]}"
                edit = None
            if edit is not None:
                rows.append((row, edit))
        return LogitEdits.of_rows(rows)

    @staticmethod
    def _tops(logprobs: Tensor, seqs: list[Sequence]) -> list[TopTokens] | None:
        """Each row's top log-probs up to its sequence's ``top_logprobs`` (None when no sequence asks)."""
        k = max(seq.params.top_logprobs for seq in seqs)
        if not k:
            return None
        ids, values = top_logprobs(logprobs, k)
        n = [seq.params.top_logprobs for seq in seqs]
        return [(i[:m], v[:m]) for i, v, m in zip(ids, values, n, strict=True)]

    @staticmethod
    def _draw(logprobs: Tensor, uniform: np.ndarray, seqs: list[Sequence]) -> Tensor:
        """One token per row by inverse-CDF sampling with the given uniforms; argmax for greedy requests."""
        return draw(logprobs.exp, uniform, seqs, lambda: logprobs.argmax(-1))

    def _verify(self, logprobs: Tensor, drafted: list[tuple[int, int]], work: list[Work]) -> list[Sampled]:
        rows = torch.tensor([c for _, c in drafted], device=self.device)
        p0, p1 = logprobs[rows], logprobs[rows + 1]
        seqs = [work[b].seq for b, _ in drafted]
        drafts = [s.draft for s in seqs]
        draft_ids = torch.tensor([d.token for d in drafts], device=self.device)
        q = torch.stack([d.logprobs for d in drafts])
        p_draft = p0.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(p_draft - q.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)).clamp(max=1.0).tolist()
        greedy_argmax = p0.argmax(-1).tolist()
        accepted = [(argmax == d.token) if s.params.greedy else u < r
                    for s, d, r, argmax, u in zip(seqs, drafts, ratio, greedy_argmax, uniforms(seqs, 0, ACCEPT).tolist(),
                                                  strict=True)]
        residual = (p0.exp() - q.exp()).clamp(min=0.0)
        degenerate = residual.sum(-1) <= 0          # p == q up to rounding: a draw from p is exact
        residual[degenerate] = p0[degenerate].exp()
        index = [i for i, ok in enumerate(accepted) if not ok]
        rejected = [seqs[i] for i in index]
        resampled = draw(lambda: residual[index], uniforms(rejected, 0, RESIDUAL), rejected,
                         lambda: p0[index].argmax(-1)).tolist() if index else []
        index = [i for i, ok in enumerate(accepted) if ok]
        kept = [seqs[i] for i in index]
        bonus = self._draw(p1[index], uniforms(kept, 1, SAMPLE), kept).tolist() if index else []
        tops0, tops1 = self._tops(p0, seqs), self._tops(p1, seqs)
        out = []
        for i, ok in enumerate(accepted):
            if ok:
                token = bonus.pop(0)
                out.append(Sampled([drafts[i].token, token], [float(p_draft[i]), float(p1[i, token])], True,
                                   None if tops0 is None else [tops0[i], tops1[i]]))
            else:
                token = resampled.pop(0)
                out.append(Sampled([token], [float(p0[i, token])], False, None if tops0 is None else [tops0[i]]))
        return out

    def _mtp_pass(self, work: list[Work], results: list[Sampled | None], flat: Tensor, width: int) -> None:
        """Run the MTP layer for every fed position whose next token is now known (reading this step's samples from
        ``results``), and draft the token after the last one for every sampling sequence."""
        rows, hidden_index, next_ids, drafting = [], [], [], []
        for b, (item, result) in enumerate(zip(work, results, strict=True)):
            seq = item.seq
            known = seq.token_ids + (result.tokens if result else [])
            positions = list(range(item.start, item.end))
            if result is not None and result.draft_accepted and len(result.tokens) == 2:
                positions.append(item.end)
            positions = [i for i in positions if i + 1 < len(known)]
            if not positions:
                continue
            rows.append(_Row(seq.block_table, [i + 1 for i in positions], positions, item.write_from))
            hidden_index.append([b * width + i - item.start for i in positions])
            next_ids.append([known[i + 1] for i in positions])
            # Penalties and grammars depend on every token before: a draft's would need the one before it accepted.
            drafting.append(b if result is not None and not seq.params.penalised else None)
        if not rows:
            return
        mtp_width = max(len(r.slots) for r in rows)
        layout = self._layout(rows, mtp_width, key_lower=1)
        gather = self._padded(hidden_index, mtp_width)
        hidden = flat[gather.reshape(-1)].reshape(len(rows), mtp_width, -1)
        out = self.model.mtp_forward(hidden, self._padded(next_ids, mtp_width), 0,
                                     self._padded([r.rope for r in rows], mtp_width), PagedAttention(self.cache,
                                                                                                   layout, self.kernel))
        last_rows = [(r, b) for r, b in enumerate(drafting) if b is not None]
        for item, result in zip(work, results, strict=True):
            if result is not None:          # its draft was verified; a partial prefill keeps a pending one
                item.seq.draft = None
        if not last_rows:
            return
        picks = torch.tensor([r * mtp_width + len(rows[r].slots) - 1 for r, _ in last_rows], device=self.device)
        logits = self.model.mtp_logits(out.reshape(-1, out.shape[-1])[picks])
        logprobs = self._sampling_logprobs(logits, [work[b].seq.params for _, b in last_rows])
        seqs = [work[b].seq for _, b in last_rows]
        # The draft is for the position after the last known token (this step's samples not yet appended).
        draft_uniforms = uniforms(seqs, [len(results[b].tokens) for _, b in last_rows], DRAFT)
        for seq, token, q in zip(seqs, self._draw(logprobs, draft_uniforms, seqs).tolist(), logprobs, strict=True):
            seq.draft = Draft(token, q)


def _truncate(result: Sampled, seq: Sequence) -> None:
    """Keep tokens up to the first stop token and within the request's token budget."""
    keep = max(0, seq.max_tokens - seq.num_output)
    for index, token in enumerate(result.tokens[:keep]):
        if token in seq.stop_ids:
            keep = index + 1
            break
    del result.tokens[keep:], result.logprobs[keep:]
    if result.top is not None:
        del result.top[keep:]


def draw(probs: Callable[[], Tensor], uniform: np.ndarray, seqs: list[Sequence],
         argmax: Callable[[], Tensor]) -> Tensor:
    """Inverse-CDF sampling of one token per row of (unnormalised) ``probs()`` with the given uniforms [N]; greedy
    rows take ``argmax()``. Each is computed only if some row needs it."""
    greedy = [s.params.greedy for s in seqs]
    if all(greedy):
        return argmax()
    cdf = probs().cumsum(-1)
    total = cdf[:, -1]
    threshold = torch.from_numpy(uniform).to(device=cdf.device, dtype=cdf.dtype) * total
    # A uniform within float32 rounding of 1 puts the threshold at the total, above every cdf value, where the
    # search would end on the last token, outside the support (a -inf log-probability) if truncation dropped it.
    # Below the total, the token found always adds mass to the cdf: its probability, and log-probability, is real.
    threshold = torch.minimum(threshold, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, threshold.unsqueeze(-1), right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    if not any(greedy):
        return tokens
    return torch.where(torch.tensor(greedy, device=cdf.device), argmax(), tokens)
