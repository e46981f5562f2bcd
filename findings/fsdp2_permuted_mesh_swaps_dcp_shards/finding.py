from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="FSDP2 on a permuted device mesh shards by process-group rank while DCP places shards "
          "by mesh coordinate: a checkpoint loaded onto a permuted mesh has its shards swapped",
    upstream="pytorch/pytorch#193224",
    affected="torch 2.13.0 (reproduced here): fully_shard takes shard_process_group.rank(), and "
             "DeviceMesh's groups list their ranks in ascending order",
    fixed="open: #193224 (DeviceMesh(preserve_rank_order=...)) was closed and 2.13.0's "
          "DeviceMesh has no such option; build the mesh in ascending rank order "
          "(init_device_mesh) and let LOCAL_RANK place the devices (--fixed)",
    reproduced_with="the real library: torch 2.13.0's fully_shard, DeviceMesh, "
                    "get_state_dict/set_state_dict and dcp.save/dcp.load, 2 gloo ranks",
    checker="state_equivalence",
    message="model and optimizer state differ after the load of step 4",
    faults=lambda: [chaos.rebalance(fraction=0.5, at_step=4)],
    world_size=2,
    steps=8,
    notes="The report cited is the mechanism, not this symptom: #193224 (a PR, closed) says "
          "DeviceMesh loses a custom rank order, reusing the default group for a dimension as "
          "large as the world and creating the others with new_group, which sorts its ranks "
          "(#176126; #176578 added new_group(sort_ranks=False), which 2.13.0 has and DeviceMesh "
          "does not pass). Searched pytorch/pytorch for FSDP2 or DCP on a permuted or custom-"
          "order mesh loading swapped shards: no report. The scenario: the rebalance moves the "
          "two ranks onto each other's device (LOCAL_RANK 1, 0), so generation 1 builds "
          "DeviceMesh('cpu', [1, 0]) and loads step-4/, saved on [0, 1], with its shards "
          "swapped: state_equivalence fails on both ranks (the digests gather each DTensor) and "
          "loss_continuity fails (step 5: 4.53 against 1.15 in the clean run). A run that starts "
          "on a permuted mesh and keeps it round-trips (its own load undoes the swap); the swap "
          "shows when the order changes between save and load. What the harness needed: "
          "nothing new (rebalance sets LOCAL_RANK; probe.digest gathers DTensors). Its hint "
          "('compare how they are sharded at save and at load (device mesh, placements)') "
          "points the right way but cannot name the permutation (the script records the mesh "
          "as a note). Here the mesh is 1-D at 2 ranks; the bundled LM's --bug permuted_mesh "
          "shows it on a 2-D mesh. With --fixed every checker passes.",
)
