"""torchft's own recovery with no harness around it: what torchft 0.2.0 does when replica groups
die, restart late or die again, measured from its workload's JSON logs (docs/torchft-notes.md,
its first table). Our harness restarts a group at once; this driver can restart it late, kill
during a heal, kill both groups, or run torchft's own DDP hook, to see torchft's behaviour alone.

    python bench/torchft_harness_free.py SCENARIO [--groups 2] [--per 1] [--steps 40]
        [--kill-at 10] [--second-at 25] [--restart-delay 0] [--extra="--quorum async"]
        [--out FOLDER] [--timeout 300]

It hosts the world store and torchft's Lighthouse (min_replicas 1, join timeout 10 s, heartbeat
timeout ``--heartbeat-ms``, 5000 by default: torchft's own), starts
``tests/workloads/torchft_train.py`` one process per rank with ``--log-dir`` (a JSON line per
attempt: committed or not, loss, sample ids, the model's digest; per heal, the digest applied; per
donation, the donor's), SIGKILLs whole replica groups, restarts them with a new
``TORCHFT_INCARNATION`` and ``TORCHFT_REJOIN=1``, and writes ``FOLDER/summary.json``: per step,
which groups committed it with what digest; steps one rank committed twice; samples consumed
twice or never; each heal's digest against its donor's; the timings. It prints all but the
per-step part. The Lighthouse logs its quorums on this process's stderr.

Scenarios: ``kill`` (group 1 in the step after group 0 committed ``--kill-at``, restarted after
``--restart-delay``), ``kill_during_heal`` (then the restarted group again, when its donor starts
serving it), ``kill_donor_during_heal`` (then the donor, while it serves; use ``--groups 3``),
``two_in_a_row`` (group 1, then group 0 after group 1 committed ``--second-at``),
``both_before_heal`` (group 1, then group 0 a second later, both restarted).

Every process it starts is killed by its pid when it returns, on an error and on SIGTERM.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

WORKLOAD = Path(__file__).resolve().parent.parent / "tests" / "workloads" / "torchft_train.py"
SAMPLES_PER_RANK = 4  # the workload's --batch default: sample ids run to steps * world * 4


class Job:
    """The replica groups this driver started, their incarnations and its own event log."""

    def __init__(self, args: argparse.Namespace, out: Path, store_port: int,
                 lighthouse: str) -> None:
        self.args, self.out = args, out
        self.env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store_port),
                    "WORLD_SIZE": str(args.groups * args.per), "TORCHFT_LIGHTHOUSE": lighthouse,
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.procs: dict[int, list[subprocess.Popen]] = {}
        self.every: list[subprocess.Popen] = []
        self.incarnations: collections.Counter = collections.Counter()
        self.log = open(out / "driver.jsonl", "a")

    def note(self, ev: str, t: float | None = None, **fields: Any) -> dict:
        fields = {"ev": ev, "t": time.time() if t is None else t, **fields}
        self.log.write(json.dumps(fields) + "\n")
        self.log.flush()
        print("driver:", json.dumps(fields), flush=True)
        return fields

    def start(self, group: int) -> None:
        """Start every rank of ``group``; a second start is a restart (a new incarnation)."""
        n = self.incarnations[group]
        self.incarnations[group] += 1
        incarnation = f"g{group}i{n}" if n else "0"
        env = {**self.env, "TORCHFT_INCARNATION": incarnation}
        if n:
            env["TORCHFT_REJOIN"] = "1"
        a = self.args
        ps = []
        for group_rank in range(a.per):
            with open(self.out / f"stdout-g{group}-r{group_rank}-i{n}.log", "w") as log:
                ps.append(subprocess.Popen(
                    [sys.executable, str(WORKLOAD), "--groups", str(a.groups),
                     "--steps", str(a.steps), "--log-dir", str(self.out),
                     "--step-sleep", str(a.step_sleep), *a.extra.split()],
                    env={**env, "RANK": str(group * a.per + group_rank)}, stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        self.procs[group] = ps
        self.every.extend(ps)
        self.note("start", group=group, incarnation=incarnation, pids=[p.pid for p in ps])

    def kill(self, group: int, why: str) -> None:
        t = time.time()  # the fault's time: its peers may see it before the wait below ends
        for p in self.procs[group]:
            p.kill()
        for p in self.procs[group]:
            p.wait(timeout=30)
        self.note("kill", t=t, group=group, why=why)

    def kill_all(self) -> None:
        for p in self.every:
            if p.poll() is None:
                p.kill()
        for p in self.every:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print(f"warning: rank process {p.pid} did not end after SIGKILL", file=sys.stderr)

    def events(self, group: int | None = None) -> list[dict]:
        """Every rank's events so far (``file``: g{group}-r{group rank}-i{incarnation})."""
        evs = []
        for f in sorted(self.out.glob("g*-r*-i*.jsonl")):
            if group is not None and _group(f.stem) != group:
                continue
            for line in f.read_text().splitlines():
                try:
                    e = json.loads(line)
                except ValueError:  # the last line of a rank killed mid-write
                    continue
                e["file"] = f.stem
                evs.append(e)
        return evs

    def wait_for(self, what: str, found: Callable[[], dict | None], deadline: float) -> dict:
        while time.time() < deadline:
            e = found()
            if e:
                return e
            time.sleep(0.002)
        raise SystemExit(f"timed out waiting for {what}; the ranks' logs are in {self.out} "
                         "(stdout-*.log); give more --timeout on a loaded machine")

    def committed(self, group: int, step: int, deadline: float) -> dict:
        return self.wait_for(
            f"group {group} to commit step {step}",
            lambda: next((e for e in self.events(group) if e["ev"] == "step" and e["committed"]
                          and e["step"] >= step), None), deadline)

    def kill_mid_step(self, group: int, after: int, step: int, deadline: float) -> None:
        """Kill ``group`` half a step after group ``after`` committed ``step``: inside the next
        step's extra work, after its quorum, so that the survivors' all-reduce of that step meets
        the dead peer (killed right at the commit, a group often dies before it asks for the next
        quorum, and the survivors only wait for the Lighthouse)."""
        self.committed(after, step, deadline)
        time.sleep(self.args.step_sleep / 2)
        self.kill(group, "mid-step")

    def donation_after(self, t: float, deadline: float, group: int | None = None) -> dict:
        """The donor's state_dict callback after ``t``: torchft is about to serve a heal."""
        return self.wait_for(
            "a donor to start serving a heal",
            lambda: next((e for e in self.events(group) if e["ev"] == "donate" and e["t"] > t),
                         None), deadline)


def _group(file: str) -> int:
    return int(file.split("-")[0][1:])


def scenario(job: Job, name: str, deadline: float) -> None:
    a = job.args
    job.kill_mid_step(1, 0, a.kill_at, deadline)
    if name == "kill":
        time.sleep(a.restart_delay)
        job.start(1)
    elif name == "kill_during_heal":
        t = time.time()
        job.start(1)
        job.donation_after(t, deadline, group=0)
        job.kill(1, "during its heal (the donor started serving)")
        job.start(1)
    elif name == "kill_donor_during_heal":
        t = time.time()
        job.start(1)
        donor = _group(job.donation_after(t, deadline)["file"])
        job.kill(donor, "the donor, while it serves group 1's heal")
        job.start(donor)
    elif name == "two_in_a_row":
        time.sleep(a.restart_delay)
        job.start(1)
        job.kill_mid_step(0, 1, a.second_at, deadline)
        time.sleep(a.restart_delay)
        job.start(0)
    elif name == "both_before_heal":
        time.sleep(1.0)
        job.kill(0, "the last up-to-date group, before group 1 is back")
        job.start(1)
        job.start(0)


def summarize(job: Job) -> dict:
    a = job.args
    driver = [json.loads(line) for line in (job.out / "driver.jsonl").read_text().splitlines()]
    evs = job.events()
    steps = [e for e in evs if e["ev"] == "step"]
    summary: dict[str, Any] = {"scenario": a.scenario, "groups": a.groups, "per": a.per,
                               "steps": a.steps, "extra": a.extra}
    by_step = collections.defaultdict(list)  # group rank 0's view of each step
    for e in steps:
        if e["file"].split("-")[1] == "r0":
            by_step[e["step"]].append((e["file"], e["committed"], round(e["loss"], 5), e["digest"]))
    summary["per_step"] = {s: by_step[s] for s in sorted(by_step)}
    summary["committed_digest_disagreements"] = {
        s: v for s, v in by_step.items() if len({d for _, c, _, d in v if c}) > 1}
    commits = collections.Counter((e["file"].rsplit("-", 1)[0], e["step"])
                                  for e in steps if e["committed"])
    summary["steps_committed_twice_by_one_rank"] = sorted(
        f"{rank} step {s} x{n}" for (rank, s), n in commits.items() if n > 1)
    count = collections.Counter(i for e in steps if e["committed"] for i in e["samples"])
    summary["samples_committed_total"] = sum(count.values())
    summary["samples_duplicated"] = sorted(i for i, n in count.items() if n > 1)
    summary["samples_never_committed"] = sorted(
        set(range(a.steps * a.groups * a.per * SAMPLES_PER_RANK)) - set(count))
    summary["samples_drawn_in_uncommitted_attempts"] = sorted(
        {i for e in steps if not e["committed"] for i in e["samples"]})
    heals = [e for e in evs if e["ev"] == "healed"]
    donations = [e for e in evs if e["ev"] == "donate"]
    summary["heals"] = [{"file": h["file"], "step": h["step"], "quorum_s": round(h["quorum_s"], 3),
                         "donors (file, step, equal digest)": [
                             (d["file"], d["step"], d["digest"] == h["digest"])
                             for d in donations if d["step"] == h["step"]]} for h in heals]
    timings = []
    for k in (d for d in driver if d["ev"] == "kill"):
        others = [e for e in steps if e["t"] > k["t"] and _group(e["file"]) != k["group"]]
        nxt = min((e for e in others if e["committed"]), key=lambda e: e["t"], default=None)
        timings.append({
            "kill": k["why"], "group": k["group"],
            "survivor_next_commit_s": round(nxt["t"] - k["t"], 3) if nxt else None,
            "survivor_next_commit (file, step)": (nxt["file"], nxt["step"]) if nxt else None,
            "survivor_uncommitted_attempts_after (file, step, s)": [
                (e["file"], e["step"], round(e["t"] - k["t"], 3))
                for e in others if not e["committed"]][:6]})
    for s in [d for d in driver if d["ev"] == "start"][a.groups:]:
        mine = [e for e in evs if e["file"].endswith(f"-i{s['incarnation']}")]
        first = min((e for e in mine if e["ev"] == "step" and e["committed"]),
                    key=lambda e: e["t"], default=None)
        attached = next((e for e in mine if e["ev"] == "start"), None)
        healed = next((e for e in mine if e["ev"] == "healed"), None)
        timings.append({
            "restart": s["incarnation"],
            "process_start_to_first_commit_s": round(first["t"] - s["t"], 3) if first else None,
            "first_commit_step": first["step"] if first else None,
            "process_start_to_probe_attach_s": round(attached["t"] - s["t"], 3) if attached else None,
            "process_start_to_healed_s": round(healed["t"] - s["t"], 3) if healed else None})
    summary["timings"] = timings
    summary["exit_codes"] = {g: [p.returncode for p in ps] for g, ps in job.procs.items()}
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scenario", choices=["kill", "kill_during_heal", "kill_donor_during_heal",
                                        "two_in_a_row", "both_before_heal"])
    p.add_argument("--groups", type=int, default=2, help="replica groups")
    p.add_argument("--per", type=int, default=1, help="ranks per replica group")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill-at", type=int, default=10, help="kill once group 0 committed this step")
    p.add_argument("--second-at", type=int, default=25,
                   help="two_in_a_row: kill group 0 once group 1 committed this step")
    p.add_argument("--restart-delay", type=float, default=0.0, help="seconds before a restart")
    p.add_argument("--step-sleep", type=float, default=0.05, help="seconds of extra work a step")
    p.add_argument("--heartbeat-ms", type=int, default=5000,
                   help="the Lighthouse's heartbeat_timeout_ms: when a silent group counts as dead")
    p.add_argument("--extra", default="",
                   help='more workload flags, e.g. --extra="--quorum async" or --extra=--torchft-hook')
    p.add_argument("--out", help="folder for the logs and summary.json (new or empty; default: "
                                 "a new temporary folder, kept)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    args = p.parse_args()
    if args.scenario == "kill_donor_during_heal" and args.groups < 3:
        p.error("kill_donor_during_heal needs --groups 3: with 2 the donor is the last "
                "up-to-date group (that is both_before_heal)")
    if args.groups < 2:
        p.error("--groups must be at least 2: the scenarios kill one group and keep another")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="torchft-harness-free-"))
    if out.exists() and any(out.iterdir()):
        p.error(f"--out {out} is not empty: name a new folder or empty this one")
    out.mkdir(parents=True, exist_ok=True)

    from torch.distributed import TCPStore
    from torchft._torchft import LighthouseServer

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}: killing the rank processes")

    signal.signal(signal.SIGTERM, on_sigterm)
    deadline = time.time() + args.timeout
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=10000,
                                  heartbeat_timeout_ms=args.heartbeat_ms)
    job = Job(args, out, store.port, lighthouse.address())
    try:
        for g in range(args.groups):
            job.start(g)
        scenario(job, args.scenario, deadline)
        for proc in job.every:
            try:
                proc.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise SystemExit(f"rank process {proc.pid} still running after --timeout "
                                 f"{args.timeout:.0f} s; its log is in {out}") from None
        job.note("done", exit_codes={g: [q.returncode for q in ps] for g, ps in job.procs.items()})
    finally:
        job.kill_all()
        lighthouse.shutdown()
    summary = summarize(job)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    brief = {k: v for k, v in summary.items() if k != "per_step"}
    for key in ("samples_duplicated", "samples_never_committed",
                "samples_drawn_in_uncommitted_attempts"):
        ids = brief.pop(key)
        brief[key] = f"{len(ids)}: {ids[:12]}{' ...' if len(ids) > 12 else ''}"
    print(json.dumps(brief, indent=1))
    print(f"summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
