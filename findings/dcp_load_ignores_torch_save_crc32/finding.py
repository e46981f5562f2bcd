from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="DCP's loader never checks the CRC-32 that torch.save writes: a byte flipped on disk "
          "after the save is loaded without a word",
    upstream="pytorch/pytorch#126952",
    affected="torch 2.13.0 (reproduced here); torch's zip reader is built with "
             "MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS (the maintainers' answer on the report), and "
             "DCP checks nothing of its own",
    fixed="open (the report, asking for an integrity check, is open; torchtitan's RFC for a "
          "SHA-256 manifest, pytorch/torchtitan#4011, is closed): a digest of the state stored "
          "beside the checkpoint and checked after the load, falling back to the checkpoint "
          "before on a mismatch (--fixed)",
    reproduced_with="the real library: torch 2.13.0's dcp.save/dcp.load (FileSystemWriter, one "
                    "torch.save record per tensor) through get_state_dict/set_state_dict, DDP, "
                    "2 gloo ranks",
    checker="state_equivalence",
    message="does not match what was loaded",
    # rank 1's 5th file event from the start of step 5 is the close of step-5/__1_0.distcp
    # (mkdir, open, write, fsync, close): a byte in its middle is inverted once it is written,
    # and rank 1 dies at its next file event (the save of step 7), so the job restarts from the
    # flipped step-5/.
    faults=lambda: [chaos.kill_at_file_event(at_step=5, event=5, mode="flip", rank=1)],
    world_size=2,
    steps=8,
    notes="The flipped byte lands inside an AdamW moment that DCP's deduplication gave rank 1 to "
          "write; both ranks load it (the state is replicated), so state_equivalence fails on "
          "both ('optimizer state differs after the load of step 5'), and crash_consistency "
          "fails too, from the files ('step-5/__1_0.distcp changed after it was written (the "
          "same 55194 bytes, not the same content)'). loss_continuity passes: one byte of a "
          "moment moves the loss less than its tolerance, which is what makes this silent. "
          "What the harness lacked: state_equivalence's hint blames sharding ('the raw "
          "optimizer.state_dict() of a sharded model is not the whole state ... compare how its "
          "state is sharded'), wrong here; it does not read the file trail crash_consistency "
          "reads, which names the changed file. With --fixed the resume rejects step-5/, falls "
          "back to step-2/ and replays 5 steps, within the declared max_rewind_steps of two "
          "intervals, and every checker passes; the file-event sweep's summary still prints "
          "that point as 'MISSED (no checker noticed the flipped byte)', since it expects a "
          "flip to fail a checker even when the job declined to load it. Not shown: a flip in a "
          "record's zip header or pickle (torch.load raises: loud), or in .metadata.",
)
