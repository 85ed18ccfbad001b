"""Failure isolation: a round stage that raises for several lanes is retried one lane at a time,
and only the lanes that fail alone end (finish_reason "error"); the others go on as if nothing
happened. Batch-invariant numerics make a lane's rerun alone give the tokens it would have had
in the batch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from lanes.drafting import Drafting
from lanes.lane import Lane
from lanes.output import Completion
from lanes.rounds import LaneRound, Step
from lanes.scheduler import Scheduler

log = logging.getLogger("lanes")

Fail = Callable[[Lane, BaseException], Completion]


def isolated(
    stage: Callable[[list[Step]], list[Completion] | None], steps: list[Step], fail: Fail
) -> list[Completion]:
    """Run stage(steps), which returns the lanes it ended (or None); if it raises, rerun it
    one step at a time and fail the lanes whose step fails alone. For stages that change no
    lane before they can raise."""
    steps = [s for s in steps if not s.lane.is_finished]
    if not steps:
        return []
    try:
        return stage(steps) or []
    except Exception as e:
        if len(steps) == 1:
            return [fail(steps[0].lane, e)]
        log.exception("a round stage failed for %d lanes; rerunning each alone", len(steps))
    ended = []
    for s in steps:
        try:
            ended += stage([s]) or []
        except Exception as e:
            ended.append(fail(s.lane, e))
    return ended


def plan_isolated(
    scheduler: Scheduler, num_drafts: Callable[[Lane, int], int], fail: Fail
) -> tuple[LaneRound, list[Completion]]:
    """Plan the round; if planning raises, fail the lanes that cannot be planned alone."""
    try:
        return scheduler.plan(num_drafts), []
    except Exception:
        log.exception("planning a round failed; planning each lane alone")
    failed = []
    for lane in list(scheduler.running):
        try:
            scheduler.plan_alone(lane, num_drafts)
        except Exception as e:
            failed.append(fail(lane, e))
    try:
        return scheduler.plan(num_drafts), failed
    except Exception as e:  # not any one lane's fault: every running lane fails
        failed += [fail(lane, e) for lane in list(scheduler.running)]
        return LaneRound((), (), scheduler.config.prefill_chunk), failed


def fill_isolated(
    drafting: Drafting, plan: LaneRound, fail: Fail
) -> tuple[LaneRound, list[Completion]]:
    """Drafts for the plan; a lane whose drafts fail alone fails (its step is dropped)."""
    try:
        return drafting.fill(plan), []
    except Exception:
        log.exception("proposing drafts failed; proposing for each lane alone")
    failed = isolated(drafting.propose_alone, [s for s in plan.decode if s.num_drafts], fail)
    keep = tuple(s for s in plan.decode if not s.lane.is_finished)
    plan = dataclasses.replace(plan, decode=keep)
    try:
        return drafting.fill(plan), failed
    except Exception as e:  # not any one lane's fault: drafting lanes fail
        failed += [fail(s.lane, e) for s in plan.decode if s.num_drafts]
        keep = tuple(s for s in plan.decode if not s.lane.is_finished)
        return dataclasses.replace(plan, decode=keep), failed
