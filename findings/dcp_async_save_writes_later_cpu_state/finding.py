from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="dcp.async_save of CPU tensors writes the state of a later step: the checkpoint "
          "holds the updates made while it was being written",
    upstream="pytorch/pytorch#144657",
    affected="torch 2.6.0 and earlier (checked in 2.6.0's source): its staging, _offload_state_dict_to_cpu, "
             "does not copy a tensor already on the CPU",
    fixed="torch 2.7.0 (pytorch/pytorch#145408: staging copies, _copy_state_dict); the "
          "installed 2.13.0 saves correctly. Workaround on <= 2.6: wait for the future before "
          "the next optimizer step, or FileSystemWriter(cache_staged_state_dict=True)",
    reproduced_with="the mechanism: torch 2.13.0's dcp.async_save (thread executor, 2 gloo "
                    "ranks, a gloo group of its own) handed torch 2.6.0's staging as "
                    "async_stager (a BlockingAsyncStager whose stage is 2.6's one call, "
                    "_offload_state_dict_to_cpu); on 2.13.0 as installed the bug does not "
                    "reproduce (20 of 20 checkpoints correct)",
    checker="state_equivalence",
    message="does not match what was loaded",
    faults=lambda: [chaos.kill(rank=1, at_step=4, phase="backward"),
                    chaos.kill(rank=1, at_step=8, phase="backward")],
    world_size=2,
    steps=12,
    notes="A race by nature: the writing thread reads the live tensors while the next step "
          "updates them. On 2 ranks here about 1 checkpoint in 100 was written before the next "
          "optimizer step (and held the right state); the two kills make the run load two "
          "checkpoints, so the harness misses the bug only if both were. state_equivalence "
          "compares what each load restored with the digest taken when async_save was called "
          "(recorded once the future completed); loss_continuity fails too (the resumed step "
          "starts from weights one update ahead). "
          "The script records its live state after each step (run.state_after), so "
          "one_step_checkpoint names it: 'the checkpoint of step 2 that rank 1 loaded in "
          "generation 1 holds step 3 (model and optimizer), not the step it was saved at' "
          "(named state_equivalence stays the entry's checker: a write torn across the "
          "update matches no step, and one_step_checkpoint then says unknown). With the fix "
          "every checker passes.")
