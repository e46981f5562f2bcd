"""state_equivalence: the state just after each load equals what was saved (or read).

Compares load digests with the latest earlier save of the same step, or with the load's own
``expected`` digest, component by component.
"""
from __future__ import annotations

from typing import Any

from pytest_reshard.checkers._text import _fault_before, _previous, _summarise
from pytest_reshard.checkers.context import CheckContext
from pytest_reshard.checkers.registry import register
from pytest_reshard.history import History
from pytest_reshard.verdict import Verdict


def state_equivalence(history: History) -> Verdict:
    """The state just after each load equals what was saved (or read), component by component."""
    check, replay = "state_equivalence", history.replay
    gens = history.generations
    first_gen = min(gens, default=0)
    loads = [c for c in history.checkpoints("load") if c.digest]
    saves = [c for c in history.checkpoints("save") if c.digest]
    advice = ("call run.checkpoint_saved(step, digest) and run.checkpoint_loaded(step, digest) with "
              "probe.digest() of each component (model, optimizer, lr_schedule, data, rng)")
    resumed = [g for g in gens.values() if g.gen != first_gen and (g.resume_step or 0) > 0]
    loaded_gens = {c.gen for c in loads}
    unverified = [f"generation {g.gen} resumed at step {g.resume_step} without recording a load "
                  "digest" for g in resumed if g.gen not in loaded_gens]
    mismatches: list[dict[str, Any]] = []
    verified = 0
    for load in loads:
        earlier = [s for s in saves if s.step == load.step and s.gen < load.gen]
        if earlier:
            src_gen = max(s.gen for s in earlier)
            baseline: dict[str, str] = {}
            for s in sorted((s for s in earlier if s.gen == src_gen),
                            key=lambda s: (s.rank, -s.index)):
                for comp, d in s.digest.items():
                    baseline.setdefault(comp, d)
            source = f"saved in generation {src_gen}"
        elif load.expected:
            src_gen, baseline, source = None, dict(load.expected), "read (the load's expected digest)"
        else:
            if load.gen != first_gen:
                unverified.append(f"the load of step {load.step} in generation {load.gen} (rank "
                                  f"{load.rank}) has no earlier save of step {load.step} and no "
                                  "expected digest")
            continue
        common = sorted(set(baseline) & set(load.digest))
        if not common:
            unverified.append(f"the load of step {load.step} in generation {load.gen} shares no "
                              f"component with what was {source} (saved {sorted(baseline)}, "
                              f"loaded {sorted(load.digest)})")
            continue
        verified += 1
        differ = [c for c in common if baseline[c] != load.digest[c]]
        if differ:
            mismatches.append({"load": load, "differ": differ, "baseline": baseline,
                               "src_gen": src_gen, "source": source})
    details: dict[str, Any] = {"loads_verified": verified, "unverified": unverified,
                               "mismatches": len(mismatches)}
    if mismatches:
        m = mismatches[0]
        load = m["load"]
        src = gens.get(m["src_gen"]) if m["src_gen"] is not None else _previous(history, load.gen)
        dst = gens.get(load.gen)
        sizes = (f" (world size {src.world_size} -> {dst.world_size})" if src and dst else "")
        kind = "resharded load" if src and dst and src.world_size != dst.world_size else "load"
        comps = " and ".join(m["differ"])
        verb = "differs" if len(m["differ"]) == 1 else "differ"
        digests = ", ".join(f"{c}: {m['baseline'][c]} -> {load.digest[c]}" for c in m["differ"])
        if "model" in m["differ"]:
            hint = ("the parameters themselves did not round-trip: shards landed in the wrong "
                    "place or were changed after loading; compare the sharding (device mesh, "
                    "placements) at save and at load")
        elif "optimizer" in m["differ"]:
            hint = ("save and load it through torch.distributed.checkpoint.state_dict "
                    "(get_state_dict/set_state_dict): the raw optimizer.state_dict() drops "
                    "sharded state")
        else:
            hint = ("the checkpoint does not round-trip it across this world size: save it with "
                    "the checkpoint and restore it on load")
        text = (f"{comps} state {verb} after the {kind} of step {load.step} in generation "
                f"{load.gen}{sizes} on rank {load.rank}: what was {m['source']} does not match what "
                f"was loaded ({digests}); {hint}")
        if len(mismatches) > 1:
            text += f" ({len(mismatches)} mismatching loads in all)"
        details["differ"] = m["differ"]
        return Verdict.failed(check, text, step=load.step, rank=load.rank, generation=load.gen,
                              fault=_fault_before(history, load.gen), details=details,
                              replay=replay)
    if unverified:
        return Verdict.unknown(check, f"{_summarise(unverified)}; {advice}", details=details,
                               replay=replay)
    if verified:
        return Verdict.passed(check, f"{verified} loads match what was saved, component by "
                              "component", details=details, replay=replay)
    if len(gens) <= 1:
        return Verdict.passed(check, "single generation: no reshard to check", details=details,
                              replay=replay)
    return Verdict.passed(check, "no generation resumed from saved state (each started at step 0): "
                          "no state to compare", details=details, replay=replay)


@register("state_equivalence", column="state", assertion="assert_state_equivalent",
          description="the state loaded after each reshard equals the state saved before it, "
                      "component by component")
def _check(ctx: CheckContext) -> Verdict:
    return state_equivalence(ctx.history)
