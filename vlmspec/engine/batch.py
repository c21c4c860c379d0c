"""Sequences decoded together, one or many: each row drafts its own tree, one target forward verifies every row's tree.

A row is one prompt (its draft prompt pruned by its own verifier scores) with its own policy state, token sink and
stopping. Prompts that join the batch together are prefilled in one left-padded target forward (each row's scores
from its own rows of it), then in one draft forward (each row cut to its own kept tokens). Every step, the rows'
trees grow level by level through one batched draft forward per level and are verified by one target forward, and
all rows' results are read at once. When every row drafts the same tree of rank paths, the whole step runs as `(B, N)`
tensors (`grow`, `acceptance`), its operations independent of the rows; trees that differ per row grow together, each
by its plan's level rule, and are padded to a common size. A finished row leaves the batch at once and, while inputs
remain, the next one is admitted in its place (continuous batching).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import torch

from ..device_tensors import host_values
from ..errors import RequestCancelled
from ..policies import BatchShape, NodeMeasure, StepOutcome, TreePlan, TreePolicy
from .acceptance import Acceptance, StepReport, StepStatistics, accept_trees
from .commit import plan_commit
from .compiled import row_bucket
from .draft import Drafted, GrownTrees, root_trees
from .grow import GrowthInputs, draft_own_trees, draft_rows
from .model_runner import ModelRunner
from .prefill import Prefiller, continuation_of
from .processing import NodeProcessing, RowSequences, TargetSampler, common_processing, uniform_processing
from .relaxed import CONFIDENCE_MEASURE, RelaxedRows
from .rows import Row, RowRequest, RowResult, RowsInFlight
from .schedule import Admission, Arrivals
from .stats import PhaseTimer, SpecStats, StepRecord
from .tree import Tree, Trees, rank_tree_shape, with_edges


class Kept(enum.Enum):
    """Where a step keeps the tokens it emits on the device, for the logits processors of the next: nowhere (no row
    processes its logits; the sinks write them when the rows finish), in the batch's `(B, T)` tensor (several rows
    share one processing), or in each row's sink (one row's sink holds its sequence as a view)."""

    NOWHERE = "nowhere"
    BATCH = "batch"
    SINKS = "sinks"


@dataclass
class Proposal:
    """What a step verifies: every row's tree, as the proposer grew it (`drafted`: the draft's side of it) and on the
    target's device (`trees`: tokens (B, N), depths, ancestors), the visibility its verification uses (`with_edges`
    form, (N, w) shared or (B, N, w) per row; None for a causal block, as one token a row is) and each row's real
    nodes where the trees are padded (`sizes`; None: every node). `plans` and `grown` (each row's plan and tree) are
    None when no row drafted (each proposes its root alone). The rows' tokens so far for the target's processors
    (`sequences`) and where the step keeps what it emits (`kept`, as `_row_sequences` says), and both caches' lengths
    at the step's start and each row's tokens fed to the draft (`fed`). `start`: the rows' next positions (B,) on the
    device where the proposer has them, else None (made from `target_starts`)."""

    drafted: GrownTrees
    trees: Trees
    visible: torch.Tensor | None
    sizes: list[int] | None
    plans: list[TreePlan] | None
    grown: list[Drafted] | None
    sequences: RowSequences
    kept: Kept
    target_starts: list[int]
    draft_starts: list[int]
    fed: list[int]
    start: torch.Tensor | None = None


class BatchDecoder:
    """Lossless tree speculative decoding of many prompts, up to `batch_size` of them in flight at once.

    One sequence is a batch of one (`batch_size` 1). `prefiller` holds the pair's runners, one per model: prompts that
    join are written into their caches where their rows decode; it gives the batch its policy, pruning and vocabulary
    limits. The batch's forwards run compiled as those runners' models do, under the pair's guard.
    """

    def __init__(self, prefiller: Prefiller):
        self.prefiller = prefiller
        self.policy = prefiller.policy
        self.vocab_limit = prefiller.vocab_limit
        self.draft_input_limit = prefiller.draft_input_limit
        self.stats = SpecStats()

    def run(
        self,
        requests: Iterable[RowRequest] | Arrivals[RowRequest],
        batch_size: int,
        admit: Callable[[list[int], int], bool] | None = None,
    ) -> Iterator[RowResult]:
        """Decode `requests`, keeping up to `batch_size` in flight; yields each as it finishes (not in input order).

        `requests` may be `Arrivals` (a server's), which new requests join while others decode. `admit(in_flight,
        positions)` may refuse another row of `positions` beside rows of `in_flight` positions (a memory budget); a
        refused request waits until a row finishes. A request carrying an `error`, or failing in its prefill, is
        yielded as failed and the others go on; a cancelled one is yielded with `RequestCancelled` (with what it
        emitted, if it had joined). `stats` holds the batch's phase times afterwards.
        At `batch_size` 1 each sequence decodes alone: its policy plans as for one sequence (`TreePolicy.plan`), not
        as a batch's row (`plan_batch`); so does a greedy row whenever it is the only one in flight.
        """
        admission = Admission(requests, batch_size, admit)
        target, draft = self._runners(batch_size)
        rows: list[Row] = []
        state: RowsInFlight | None = None
        self.stats = SpecStats()
        timer = PhaseTimer(self.stats, target.device)
        try:
            while True:
                joining = admission.fill([row.request.positions for row in rows])
                for request in joining.failed:
                    error = request.error or RequestCancelled("cancelled before it ran")
                    yield RowResult(request.key, None, None, error)
                joined = len(rows)
                for request, admitted in self.prefiller.admit(joining.rows):
                    if isinstance(admitted, Exception):
                        yield RowResult(request.key, None, None, admitted)
                    elif admitted.sink.finished:
                        yield admitted.result()
                    else:
                        rows.append(admitted)
                if len(rows) > joined:
                    self._check_compiled(rows, target, draft)
                    state = None
                if not rows:
                    if admission.exhausted:
                        timer.collect(wait=True)
                        return
                    # Every prompt admitted this round finished at its prefill (or failed): admit the next ones.
                    continue
                if state is None:
                    # Rows joined or left: the state is made anew from the rows in flight.
                    state = RowsInFlight.of(rows, batch_size == 1, target.device)
                self._step(state, target, draft, timer)
                rows, results = self._retire(rows, target, draft)
                if results:
                    state = None
                yield from results
        finally:
            for row in rows:
                row.sink.close()
            self.prefiller.release()

    def _retire(self, rows: list[Row], target: ModelRunner, draft: ModelRunner) -> tuple[list[Row], list[RowResult]]:
        """Let the rows that finished or were cancelled leave both caches (a freed slot takes the last row); returns
        the rows still in flight, in their new order, and the results of those that left (a cancelled row's carrying
        `RequestCancelled`, with what it emitted)."""
        done = [b for b, row in enumerate(rows) if row.sink.finished or row.request.cancelled]
        if not done:
            return rows, []
        for b in done:
            if rows[b].settings.return_cache and rows[b].sink.finished:
                rows[b].cache = continuation_of(rows[b], target, b, draft)
        order = target.drop(done)
        draft.drop(done)
        results = []
        for b in done:
            result = rows[b].result()
            if not rows[b].sink.finished:
                result.error = RequestCancelled("its caller cancelled it")
            results.append(result)
        return [rows[b] for b in order], results

    def warm_up(self, request: RowRequest, largest: int, batch_size: int = 1) -> None:
        """Admit `request` alone and run each compiled model's check against eager forwards; then, for every row
        bucket a batch of up to `batch_size` rows meets, admit that many copies of it, run a forward of every padded
        size up to `largest` tokens over them (compiling each), and decode the copies (compiling the step's own
        regions: growth, acceptance, the gathers): with 2 and 3 tokens, whose last steps verify a root alone and a
        tree one level deep, as every budget's last steps may, then with budgets spread up to the request's, so that
        the rows end apart and the batch meets rows near their budgets beside others, as a stream does; then twice
        that many rows, so that rows join as others end (a row's first plan beside others' own)."""
        buckets = sorted({row_bucket(rows) for rows in range(1, batch_size + 1)})
        most = request.settings.max_new_tokens
        for bucket in buckets:
            copies = [replace(request, key=b) for b in range(bucket)]
            if not self._warm_forwards(copies, largest, bucket == 1):
                return
            spread = [max(2, most * (bucket - b) // bucket) for b in range(bucket)]
            runs = [[2] * bucket, [3] * bucket, spread]
            if bucket > 1:  # twice the rows: later ones join as others end, their first plans beside others' own
                runs.append(spread + spread)
            for budgets in runs:
                rows = [
                    replace(request, key=b, settings=replace(request.settings, max_new_tokens=n))
                    for b, n in enumerate(budgets)
                ]
                for _ in self.run(rows, bucket):
                    pass

    def _warm_forwards(self, copies: list[RowRequest], largest: int, check: bool) -> bool:
        """Admit `copies` (with `check`, check the compiled forwards first) and run a forward of every padded size up
        to `largest` tokens over them; let them go undecoded. False when they finish at their prefill."""
        target, draft = self._runners(len(copies))
        try:
            rows = []
            for _, row in self.prefiller.admit(copies):
                if isinstance(row, Exception):
                    raise row
                rows.append(row)
            if rows[0].sink.finished:
                return False
            if check:
                self._check_compiled(rows, target, draft)
            for runner in (target, draft):
                runner.warm_up(largest)
            return True
        finally:
            self.prefiller.release()

    def _runners(self, batch_size: int) -> tuple[ModelRunner, ModelRunner]:
        """The pair's target and draft runners, each started on a batch of up to `batch_size` rows (compiled as the
        pair runs now: eager once it fell back)."""
        target, draft = self.prefiller.target, self.prefiller.draft
        for runner in (target, draft):
            runner.start(batch_size)
        return target, draft

    def _check_compiled(self, rows: list[Row], target: ModelRunner, draft: ModelRunner) -> None:
        """Check each model's compiled batched forwards against eager ones once (`ModelRunner.check_compiled`), from the
        rows' next tokens, before they decode."""
        first = torch.stack([row.pending[0] for row in rows])
        target.check_compiled(first)
        draft.check_compiled(first.clamp_max(self.draft_input_limit - 1))

    def _step(self, state: RowsInFlight, target: ModelRunner, draft: ModelRunner, timer: PhaseTimer) -> None:
        """One step of every row, written once: plan and propose (`_propose`: every row's tree as `(B, N)` tensors; a
        row that drafts nothing proposes its root alone), verify (one target forward over every row's tree), accept
        (on the device, one read), then commit both caches and let every row's policy observe the step (a plain step
        commits nothing to the draft, which catches up when it next drafts). `state` holds the rows in flight and
        is moved on explicitly: the commit's pending tokens, then the emitted tokens."""
        step_started = time.perf_counter()
        rows = state.rows
        samples = [row.settings.sampler.do_sample for row in rows]
        plain = self.policy.drafting([row.policy for row in rows], samples, [row.sink.room for row in rows])
        proposal = self._propose(state, plain, samples, target, draft, timer)
        with timer("verification"):
            start = proposal.start
            if start is None:
                start = host_values(target.positions(proposal.target_starts), target.device)
            trees = proposal.trees
            logits, features = target.verify(trees.tokens, trees.depths, start, proposal.visible, proposal.sizes)
        with timer("acceptance"):
            accepted = self._accept(state, proposal, logits)
            timer.collect()
            self._judge_on_host(rows, accepted, logits)
        if proposal.plans is None:
            self._observe_plain(rows, plain, accepted, proposal.kept, step_started, features)
        else:
            with timer("tree_update"):
                starts = (proposal.target_starts, proposal.draft_starts, proposal.fed)
                state.committed(*self._commit(accepted.reports, proposal.drafted, (target, draft), features, *starts))
            drafted = proposal.drafted
            carried = (len(rows) * trees.size, drafted.forwards, drafted.fed_tokens)
            tokens = list(accepted.tokens)
            self._finish(
                rows,
                proposal.plans,
                proposal.grown,
                accepted.reports,
                tokens,
                carried,
                starts,
                timer,
                step_started,
                plain,
                on_device=proposal.kept is Kept.SINKS,
            )
        state.advance(accepted.tokens, [report.count for report in accepted.reports])

    def _propose(
        self,
        state: RowsInFlight,
        plain: list[str | None],
        samples: list[bool],
        target: ModelRunner,
        draft: ModelRunner,
        timer: PhaseTimer,
    ) -> Proposal:
        """Every row's proposal for the step: its root alone when no row drafts (`plain` says why, per row); one tree
        of rank paths grown for all rows at once when every row drafts it under one rule; else each row's own tree,
        grown together by each row's plan's level rule."""
        if None not in plain:
            return self._propose_roots(state, target, timer)
        rows = state.rows
        pending = state.drafting(draft.device)
        depths = [0 if why is not None else row.sink.room - 1 for row, why in zip(rows, plain, strict=True)]
        sampling = set(samples)
        if state.alone or (len(rows) == 1 and True not in sampling):
            # A row decoding alone plans as one sequence does, also in a batch whose other rows have finished (or not
            # arrived): a greedy row's tree changes no token. A sampled row in a batch keeps the batch's plan, so that
            # its seeded draws do not depend on what else happens to be in flight.
            plans = [rows[0].policy.plan()]
        else:
            plans = self.policy.plan_batch([row.policy for row in rows], timed=True not in sampling)
        shared = _shared_paths(plans) and len(sampling) == 1
        return self._propose_trees(state, pending, (plans, shared), depths, target, draft, timer)

    def _propose_roots(self, state: RowsInFlight, target: ModelRunner, timer: PhaseTimer) -> Proposal:
        """No row drafts: each row's last token alone, which the target's forward turns into its next token as
        `generate`'s step does. Nothing runs on the draft: the tokens are its `missed` ones, fed when it next drafts."""
        rows = state.rows
        samplers = [row.settings.sampler for row in rows]
        sequences, _, kept = self._row_sequences(state, [None] * len(rows), samplers, target.device)
        target_starts = list(target.lengths)
        with timer("verification"):
            positions = target.positions(target_starts)
            held = host_values([row.sink.last_token for row in rows] + positions, target.device)
            roots, start = held[: len(rows)], held[len(rows) :]
            drafted = root_trees(roots)
        return Proposal(drafted, drafted.trees, None, None, None, None, sequences, kept, target_starts, [], [], start)

    def _propose_trees(
        self,
        state: RowsInFlight,
        pending: tuple[torch.Tensor, list[int]],
        plans: tuple[list[TreePlan], bool],
        depths: list[int],
        target: ModelRunner,
        draft: ModelRunner,
        timer: PhaseTimer,
    ) -> Proposal:
        """Every row's tree, fed first each row's `pending` tokens ((B, P) and counts), row b at most `depths[b]`
        levels. When `plans` say every row drafts one tree of rank paths under one rule (`shared`), it grows as
        `draft_rows` (a fixed number of operations over all rows per level); else each row's own tree grows by its
        plan's level rule (`draft_own_trees`), padded to the largest, each row's real nodes counted."""
        rows, (plans, shared) = state.rows, plans
        processings = [row.settings.draft_processing for row in rows]
        samplers = [row.settings.sampler for row in rows]
        sequences, draft_sequences, kept = self._row_sequences(state, processings, samplers, target.device)
        draft_starts, target_starts = list(draft.lengths), list(target.lengths)
        with timer("drafting"):
            measure = _verification_measure(rows)
            inputs = self._growth_inputs(draft, pending, depths, processings, draft_sequences, state.features, measure)
            if shared:
                shape = rank_tree_shape(plans[0].paths, draft.device)
                drafted = draft_rows(inputs, shape, plans[0].top_k, plans[0].node_measure)
            else:
                drafted = draft_own_trees(inputs, plans)
            grown = [drafted.row(b) for b in range(len(rows))]
        trees = drafted.trees.to(target.device)
        if shared:
            nodes = slice(0, trees.size)
            visible = rank_tree_shape(plans[0].paths, target.device).block(nodes, nodes, len(rows))
            sizes = None
            plans = [plans[0]] * len(rows)
        else:
            made = drafted.visible
            visible = with_edges(trees.ancestors) if made is None else made.to(target.device)
            sizes = drafted.sizes
        fed = pending[1]
        return Proposal(drafted, trees, visible, sizes, plans, grown, sequences, kept, target_starts, draft_starts, fed)

    def _growth_inputs(
        self,
        draft: ModelRunner,
        pending: tuple[torch.Tensor, list[int]],
        depths: list[int],
        processings: list[NodeProcessing | None],
        sequences: RowSequences,
        features: torch.Tensor | None,
        confidence: NodeMeasure | None = None,
    ) -> GrowthInputs:
        """What the growth of the rows' trees reads: their `pending` tokens ((B, P) and counts), each row growing at
        most `depths[b]` levels under its draft `processings` over its tokens so far (`sequences`), a head beside the
        target's `features` of the tokens before them, and what their verification measures of each node (`confidence`,
        `GrowthInputs`)."""
        limits = (self.vocab_limit, self.draft_input_limit)
        return GrowthInputs(draft, *pending, depths, *limits, processings, sequences, features, confidence)

    def _accept(self, state: RowsInFlight, proposal: Proposal, logits: torch.Tensor) -> Acceptance:
        """Every row's accepted path of its proposal, its tokens and its report, on the device (`accept_trees`), under
        the rows' EOS ids and stop strings as `state` holds them."""
        rows = state.rows
        drafted, policy = proposal.drafted, rows[0].policy
        plain = proposal.plans is None
        return accept_trees(
            drafted,
            proposal.trees,
            logits,
            [row.settings.sampler for row in rows],
            proposal.sequences,
            state.eos,
            [row.sink.room for row in rows],
            None if plain else StepStatistics(policy, drafted.root_log_probs, drafted.trees),
            False if plain else policy.reads_tree,
            state.strings,
            capture=self.prefiller.target,
            relaxed=RelaxedRows.of([row.settings.verification for row in rows], logits.device),
        )

    def _observe_plain(
        self,
        rows: list[Row],
        plain: list[str | None],
        accepted: Acceptance,
        kept: Kept,
        step_started: float,
        features: torch.Tensor | None,
    ) -> None:
        """After a step in which no row drafted: the policies learn what it cost, each row records it, its sink takes
        its token, and the draft owes that token (`missed`, with the target's `features` of its root (B, 1, F) where a
        head drafts)."""
        seconds = time.perf_counter() - step_started
        self.policy.observe_plain([row.policy for row in rows], plain, seconds)
        for b, row in enumerate(rows):
            report = accepted.reports[b]
            row.miss(report.tokens[: report.count], None if features is None else features[b])
            record = StepRecord(alpha=None, depth=0, width=0.0, nodes=0, accepted=0, tree_depth=0, greedy_depth=0)
            record.seconds, record.plain = seconds, plain[b]
            row.stats.steps.append(record)
            row.sink.take(accepted.tokens[b], report, kept is Kept.SINKS)

    def _finish(
        self,
        rows: list[Row],
        plans: list[TreePlan],
        grown: list[Drafted],
        reports: list[StepReport],
        tokens: list[torch.Tensor],
        carried: tuple[int, int, int],
        starts: tuple[list[int], list[int], list[int]],
        timer: PhaseTimer,
        step_started: float,
        plain: list[str | None],
        on_device: bool = True,
    ) -> None:
        """Every row's policy learns from the step and its statistics record it, then its sink takes the tokens it
        emitted. `carried` is what the step's forwards carried (verified tokens, draft forwards, draft tokens, padding
        included), `starts` the target's and the draft's cache lengths at the step's start and each row's pending
        count, `plain` why a row drafted nothing (None where it drafted); with more than one row each observes the
        batch's shape, what the rows share recorded once."""
        target_starts, draft_starts, pending = starts
        shape = BatchShape(
            rows=len(rows),
            tree_tokens=carried[0],
            draft_forwards=carried[1],
            draft_tokens=carried[2],
            emitted=sum(report.count for report in reports),
            target_context=sum(target_starts) // len(rows),
            draft_context=(sum(draft_starts) + sum(pending)) // len(rows),
            first=True,
        )
        for b, row in enumerate(rows):
            contexts = (draft_starts[b] + pending[b], target_starts[b])
            batch = shape if len(rows) > 1 else None
            tree = grown[b].tree
            observe_step(
                row.policy,
                plans[b],
                grown[b],
                tree,
                reports[b],
                row.stats,
                timer,
                step_started,
                contexts,
                batch,
                plain[b],
                row.settings.sampler.do_sample,
            )
            shape = replace(shape, first=False)
            row.sink.take(tokens[b], reports[b], on_device)

    def _row_sequences(
        self,
        state: RowsInFlight,
        processings: list[NodeProcessing | None],
        samplers: list[TargetSampler],
        device: torch.device,
    ) -> tuple[RowSequences, RowSequences, Kept]:
        """The rows' tokens so far, for the target's processors and the draft's, and where the step keeps the tokens
        it emits (`Kept`): nowhere on the device when no row processes its logits (the sinks write them when the rows
        finish), in the batch's `(B, T)` tensor when several rows share one processing, else in each row's sink (one
        row's sink holds its sequence as a view, where a `(B, T)` tensor costs launches to keep).
        Both stay on the target's `device`, where the config's processors were built."""
        rows = state.rows
        target_processings = [s.processing for s in samplers]
        if uniform_processing(processings + target_processings):
            state.forget_history()
            return [None] * len(rows), [None] * len(rows), Kept.NOWHERE
        shared = (uniform_processing(g) or common_processing(g) is not None for g in (processings, target_processings))
        if len(rows) > 1 and all(shared):
            sequences = state.sequences(device)
            return sequences, sequences.clamp_max(self.vocab_limit - 1), Kept.BATCH
        state.forget_history()
        sequences = [row.sink.sequence for row in rows]
        draft_sequences = [
            s if p is None else s.clamp_max(self.vocab_limit - 1) for s, p in zip(sequences, processings, strict=True)
        ]
        return sequences, draft_sequences, Kept.SINKS

    def _judge_on_host(self, rows: list[Row], accepted: Acceptance, logits: torch.Tensor) -> None:
        """Keep the scores and logits of what each row emits, from the verification's `logits` (B, N, V) at its
        accepted path, and cut each row whose host-side stopping criteria stop it (`TokenSink.judge`), all rows'
        criteria read at once: nothing runs for rows that ask for neither."""
        judged = {}
        for b, row in enumerate(rows):
            if row.settings.judged_on_host:
                report = accepted.reports[b]
                chosen = logits[b, report.path[: report.count]] if row.settings.records else None
                judged[b] = row.sink.judge(accepted.tokens[b], report.count, chosen)
        answers = [j.answers for j in judged.values() if j.answers is not None]
        # Every row's criteria's answers in one read.
        read = torch.cat(answers).tolist() if answers else []
        for b, own in judged.items():
            count = 0 if own.answers is None else own.answers.shape[0]
            stop = rows[b].sink.settle(own, read[:count])
            read = read[count:]
            if stop is not None:
                accepted.reports[b] = _cut(accepted.reports[b], stop, accepted.verdict.differs, b)

    def _commit(
        self,
        reports: list[StepReport],
        drafted: GrownTrees,
        runners: tuple[ModelRunner, ModelRunner],
        features: torch.Tensor | None,
        target_starts: list[int],
        draft_starts: list[int],
        fed: list[int],
    ) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
        """Keep every row's accepted path in both caches (one gather each); returns the tokens each row's draft has
        not seen yet, `(B, P)` and counts, which the next step feeds as they are while the rows stay, and where a head
        drafts the verification's `features` (B, N, F) of the tokens before them: the root's and the accepted
        nodes' (a head keeps none of the tree it was fed, `keeps_tree`, so every emitted token is pending)."""
        target, draft = runners
        slots = drafted.slots or [None] * len(reports)
        cached = drafted.cached_depths if draft.keeps_tree else [0] * len(reports)
        plan = plan_commit(reports, fed, cached, slots, target.device, draft.device)
        target.keep_rows(target_starts, plan.target, plan.target_counts)
        draft.keep_rows(draft_starts, plan.draft, plan.draft_counts)
        if features is None:
            return plan.pending, plan.pending_counts, None
        index = plan.target[..., None].expand(-1, -1, features.shape[-1])
        return plan.pending, plan.pending_counts, features.gather(1, index).to(draft.device)


def _cut(report: StepReport, stop: int, differs: torch.Tensor | None, b: int) -> StepReport:
    """Row `b`'s `report` cut to its first `stop` tokens by a host-side criterion: finished, and counting only the
    tokens it still emits that differ from the target's choice (relaxed verification's `differs` (B, depth + 1), read
    here: only on this host-side path, and only where a row's count was cut and some token differed)."""
    differing = report.differing
    if differing and stop < report.count and differs is not None:
        differing = int(differs[b, :stop].sum())
    return replace(report, count=stop, finished=True, differing=differing)


def _verification_measure(rows: list[Row]) -> NodeMeasure | None:
    """What the growth measures for the rows' verification: the draft's confidence where a row verifies relaxed."""
    return CONFIDENCE_MEASURE if any(row.settings.verification is not None for row in rows) else None


def _shared_paths(plans: list[TreePlan]) -> bool:
    """Whether every plan is the same tree of rank paths (so the rows' trees share one structure)."""
    first = plans[0].paths
    return first is not None and all(p.paths is first or p.paths == first for p in plans)


def observe_step(
    policy: TreePolicy,
    plan: TreePlan,
    drafted: Drafted,
    tree: Tree,
    report: StepReport,
    stats: SpecStats,
    timer: PhaseTimer,
    step_started: float,
    contexts: tuple[int, int],
    batch: BatchShape | None = None,
    plain: str | None = None,
    sampled: bool = False,
) -> None:
    """The one observer of a finished step: the policy learns from it and `stats` records it, with what the policy's
    `observe` returned (its planned confidence and prediction). `contexts` are the draft's and the target's cache
    lengths the step's forwards ran over; `batch` what the whole step fed and emitted when the sequence decoded among
    others (their step times are its times), None when it decoded alone; `plain` why the sequence drafted nothing
    while others did (None: it drafted); `sampled` whether the sequence samples its tokens."""
    lesson = policy.observe(
        StepOutcome(
            root_log_probs=drafted.root_log_probs,
            accepted=report.accepted,
            tree=drafted.tree,
            path=report.path,
            draft_forwards=drafted.forwards,
            draft_tokens=drafted.fed_tokens,
            draft_context=contexts[0],
            target_context=contexts[1],
            draft_seconds=timer.last["drafting"],
            verify_seconds=timer.last["verification"],
            seconds=time.perf_counter() - step_started,
            statistics=report.statistics,
            tree_parents=report.tree_parents,
            tree_log_probs=report.tree_log_probs,
            batch=batch,
            drafted=plain is None,
            sampled=sampled,
        )
    )
    stats.steps.append(
        StepRecord(
            alpha=lesson.alpha,
            depth=plan.depth,
            width=plan.width,
            nodes=tree.size - 1,
            accepted=report.accepted,
            tree_depth=tree.depth,
            greedy_depth=report.greedy_depth,
            seconds=timer.last["drafting"] + timer.last["verification"],
            predicted_tokens=lesson.predicted_tokens,
            predicted_seconds=lesson.predicted_seconds,
            plain=plain,
            differing=report.differing,
        )
    )
