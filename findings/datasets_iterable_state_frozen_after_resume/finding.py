from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="datasets 5.0.0's IterableDataset stops tracking its position after a resume: every "
          "later checkpoint holds the start of the stream, and a second resume replays it",
    upstream="huggingface/datasets#8308 (fix: #8295); in torchtitan: pytorch/torchtitan#3907",
    affected="datasets 5.0.0: #8194 made _BaseExamplesIterable.load_state_dict rebind the "
             "iterable's state to a new dict (_init_state_dict) while IterableDataset._state_dict "
             "keeps the old one; 4.8.5 and earlier update it in place",
    fixed="datasets 5.0.1 (#8295, merged 2026-07-06: the dataset's state re-pointed at the "
          "live one after the load); torchtitan's workaround pins datasets<4.8.0 "
          "(pytorch/torchtitan#3908). The installed 5.2.0 resumes correctly",
    reproduced_with="the mechanism on the real library: datasets 5.2.0's IterableDataset "
                    "(split_dataset_by_node, 2 gloo ranks, torchdata 0.11.0's "
                    "StatefulDataLoader, num_workers=0) given 5.0.0's resume in a subclass "
                    "(the installed code without 5.0.1's re-pointing line). Checked once "
                    "against datasets 5.0.0 itself, installed in a scratch folder on PYTHONPATH: "
                    "--fixed (no subclass) then fails with the same message word for word, and "
                    "reproduce.py --fixed prints the same ids",
    checker="exactly_once_samples",
    message="at step 0 (generation 0, rank 0) and again at step 6 (generation 2, rank 0)",
    faults=lambda: [chaos.kill(rank=1, at_step=4, phase="backward"),
                    chaos.kill(rank=1, at_step=8, phase="backward")],
    world_size=2,
    steps=12,
    notes="64 samples (one epoch covers the run), a save every 3 steps. The first kill resumes "
          "from the save after step 2, whose data state is sound, and generation 1 trains the "
          "right samples; but its save after step 5 holds the start of the stream, so after the "
          "second kill generation 2 trains steps 0-5's samples again from step 6 (24 "
          "duplicates; loss_continuity fails too). One resume shows nothing. state_equivalence "
          "passes and cannot see it: the checkpoint holds what the loader's state_dict() "
          "returned, and the script digests no data state (right after load_state_dict, before "
          "the first batch, StatefulDataLoader.state_dict() reports the fresh dataset's zero "
          "position, in 5.0.0 and in the fixed 5.2.0 alike: the resumed iterable is built at "
          "the first next()). What the harness lacked: a data position of its own to compare with the "
          "one the library reports; meanwhile loss_continuity's hint points at "
          "state_equivalence, which passes. Not covered: num_workers > 0 (_iter_pytorch, the "
          "same missing line in the worker). With the fix every checker passes.",
)
