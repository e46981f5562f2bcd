from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="prime-rl's SFT trainer calls iter() on its StatefulDataLoader before the resume "
          "loads it: with a worker, every resume trains the data from the beginning",
    upstream="PrimeIntellect-ai/prime-rl#3332",
    affected="prime-rl SFT from #3299 (merged 2026-08-18, data.num_workers default 1) until "
             "#3332; any num_workers > 0 configuration before that",
    fixed="PrimeIntellect-ai/prime-rl#3332 (merged 2026-08-21): the iterator is created after "
          "the checkpoint's load_state_dict (--fixed)",
    reproduced_with="the real library: torchdata 0.11.0's StatefulDataLoader (num_workers=1, a "
                    "DistributedSampler) with prime-rl's call order in a user-style script "
                    "(prime-rl is not installed); torch 2.13.0, 2 gloo ranks",
    checker="exactly_once_samples",
    message="consumed twice",
    faults=lambda: [chaos.kill(rank=1, at_step=5, phase="backward")],
    steps=8,
    notes="64 samples (one epoch covers the run), a save every 3 steps: the kill at step 5 "
          "resumes from the save after step 2, and steps 3-7 train the batches of steps 0-4 "
          "again: the 12 samples of kept steps 0-2 twice (loss_continuity fails too, a loss "
          "spike at step 3). The harness needed nothing new. state_equivalence passes and would "
          "with a data digest too: the loader holds the loaded state, its worker ignores it. "
          "Not judged: the report's second symptom (state_dict() keeps returning the stashed "
          "state, so later checkpoints freeze the position); reproduce.py prints it.",
)
