from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Lightning resumes a mid-epoch checkpoint with a plain DataLoader from the start of "
          "the epoch: the epoch's first batches are trained again, its last ones never",
    upstream="Lightning-AI/pytorch-lightning#18780",
    affected="lightning 2.x with a training loader that has no state_dict/load_state_dict "
             "(a torch DataLoader); checked on 2.6.6. Lightning restores its loops at the saved "
             "batch and only warns ('your dataloader is not resumable')",
    fixed="open for a plain DataLoader (by design: #18780, where the maintainers say Lightning "
          "handles the loop state and not the data's). What the thread settled on: a loader with "
          "state_dict/load_state_dict, which the checkpoint holds since lightning 2.2.0 "
          "(#19361; #19475 then silenced the warning for it). --fixed: torchdata 0.11.0's "
          "StatefulDataLoader over its StatefulDistributedSampler, with "
          "Trainer(use_distributed_sampler=False)",
    reproduced_with="the real library: lightning 2.6.6 (strategy='ddp', 2 gloo ranks, "
                    "ReshardCallback) and torchdata 0.11.0",
    checker="exactly_once_samples",
    message="(epoch 1) consumed twice",
    faults=lambda: [chaos.kill(rank=1, at_step=3, phase="backward")],
    world_size=2,
    steps=4,
    notes="16 samples, 2 steps an epoch, a checkpoint after every step: the kill in step 3 "
          "(batch 1 of epoch 1) resumes from the save after step 2, mid-epoch. The plain loader "
          "starts epoch 1 over, so step 3 trains step 2's samples again (8 duplicates) and "
          "never the epoch's last 8; loss_continuity fails at the resume and state_equivalence "
          "on the data position (the adapter records where the data really resumes: a loader "
          "without state_dict restarts its epoch). The harness needed nothing new. What "
          "surprised: torchdata's StatefulDataLoader(shuffle=True) as a drop-in, under DDP, "
          "still fails (6 duplicates): Lightning wraps torchdata's RandomSampler, which is no "
          "torch RandomSampler, in a DistributedSamplerWrapper that has no state_dict, so the "
          "loader's state holds a batch count and the resumed process fast-forwards through "
          "another permutation. Hence --fixed gives the loader a stateful distributed sampler "
          "of its own. Both paths seed the loader from a generator of its own, so training "
          "draws nothing from the global RNG, which a .ckpt does not hold "
          "(findings/lightning_checkpoint_holds_no_rng). Not shown: a resume at another world "
          "size (StatefulDistributedSampler's position is per rank).",
)
