"""TC510 collective-in-rank-branch: a collective (``dist.barrier()``, ``all_reduce``, ``broadcast``...) that
only some ranks call, inside ``if rank == 0:`` or another test that picks ranks.

Every rank of a process group must make the same collectives in the same order; the ranks that skip one
leave the others waiting in it until the group's timeout, and the job dies there. Reported at the call (or
at the call of a function of this file that makes one). Not reported where the other side of the ``if``
makes the same collective, or another rank test of the same function does (``torch_distributed_zero_first``:
the other ranks wait at a barrier, rank 0 joins it after its work). No automatic fix: where the collective
belongs is the author's choice.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.distributed import in_test_code, is_collective, rank_branch
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import call_nodes

# A call of ``all_reduce``, ``all_gather*``, ``all_to_all*``, ``reduce``, ``reduce_scatter*``, ``broadcast*``,
# ``barrier``, ``monitored_barrier``, ``gather*`` or ``scatter*`` (as a whole word): grouped by first letter,
# each word's left edge checked after that letter (``g(?<!\wg)`` is ``\bg``), so the search goes by first
# letters (three times faster over a whole file than with ``\b`` in front).
COLLECTIVE_CALL = (
    r"(?:a(?<!\wa)ll_(?:reduce|gather\w*|to_all\w*)|r(?<!\wr)educe(?:_scatter\w*)?|b(?<!\wb)(?:roadcast\w*|arrier)"
    r"|m(?<!\wm)onitored_barrier|g(?<!\wg)ather\w*|s(?<!\ws)catter\w*)\("
)


def _short(call: CallSite) -> str:
    return (call.qualname or "").rsplit(".", 1)[-1]


class CollectiveInRankBranch(ScriptRule):
    id = "TC510"
    triggers = (COLLECTIVE_CALL,)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks:
            return
        collectives = [c for c in facts.calls if is_collective(c) and not in_test_code(c.ctx)]
        if not collectives:
            return
        # Functions of this file that make a collective themselves (not in a nested function).
        making: dict[str, CallSite] = {}
        for call in collectives:
            fn = call.ctx.function
            if fn is not None and rank_branch(facts, call.ctx) is None:
                making.setdefault(fn.name.value, call)
        for call in facts.calls:
            if in_test_code(call.ctx):
                continue
            if is_collective(call):
                made, what, via = call, f"`{facts.code(call.node.func)}()`", ""
            elif call.name is not None and call.name.removeprefix("self.") in making and "." not in call.name.removeprefix(
                    "self."):
                made = making[call.name.removeprefix("self.")]
                what = f"`{call.name}()`"
                via = f" `{call.name}()` makes `{facts.code(made.node.func)}()` (line " \
                      f"{facts.line_of(made.node)})."
            else:
                continue
            found = rank_branch(facts, call.ctx)
            if found is None:
                continue
            branch, in_else = found
            if self._matched(facts, call, made, branch, in_else, collectives, making):
                continue
            test = facts.code(branch.test)
            side = f"the `else` of `if {test}:`" if in_else else f"`if {test}:`"
            yield self.finding(
                facts,
                call.node,
                f"{what} runs on some ranks only: the others never make this collective and the job hangs",
                explanation=f"It runs under {side}.{via} Every rank of a process group must make the same "
                "collectives in the same order. The ranks that skip this one leave the others waiting in it until "
                "the group's timeout (10 minutes for NCCL by default), and the job dies there. Make the collective "
                "on every rank (compute on all, print on one).",
            )

    @staticmethod
    def _matched(facts: ScriptFacts, call: CallSite, made: CallSite, branch: cst.If, in_else: bool,
                 collectives: list[CallSite], making: dict[str, CallSite]) -> bool:
        """The same collective on the other side of the ``if``, or in another rank test of the function."""
        short = _short(made)
        other = branch.body if in_else else branch.orelse
        if other is not None:
            inside = {id(node) for node in call_nodes(other)}
            for site in facts.calls:
                if id(site.node) not in inside:
                    continue
                if is_collective(site) and _short(site) == short:
                    return True
                inner = making.get((site.name or "").removeprefix("self."))
                if inner is not None and _short(inner) == short:
                    return True
        siblings = _block_of(facts, call, branch)
        for other_call in collectives:
            if other_call is made or other_call.ctx.function is not call.ctx.function or _short(other_call) != short:
                continue
            found = rank_branch(facts, other_call.ctx)
            if found is not None and found[0] is not branch and siblings is not None and any(
                    statement is found[0] for statement in siblings):
                return True  # torch_distributed_zero_first: the other ranks wait first, rank 0 after its work
        return False


def _block_of(facts: ScriptFacts, call: CallSite, branch: cst.If) -> "list[cst.CSTNode] | None":
    """The statements of the block that holds ``branch`` (its siblings)."""
    for frame in call.ctx.chain():
        if frame.node is branch:
            parent = frame.parent
            node = parent.node if parent is not None else None
            body = getattr(node, "body", None)
            if isinstance(node, cst.Module):
                return list(node.body)
            if isinstance(body, cst.IndentedBlock):
                statements = list(body.body)
                orelse = getattr(node, "orelse", None)
                if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock):
                    statements += list(orelse.body.body)
                return statements
            return None
    return None
