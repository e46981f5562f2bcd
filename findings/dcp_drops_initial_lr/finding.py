from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="DCP drops the optimizer's initial_lr: a schedule rebuilt at the restored step dies",
    upstream="pytorch/pytorch#140900",
    affected="torch 2.5 (reported) to 2.13.0 (reproduced here)",
    fixed="open in torch (closed upstream with a workaround): save the scheduler's own "
          "state_dict and load it into a schedule built fresh, as torchtitan does (--fixed)",
    reproduced_with="the real library: torch 2.13.0's get_state_dict/set_state_dict with "
                    "dcp.save/dcp.load, 2 gloo ranks",
    checker="liveness",
    message="initial_lr",
    faults=lambda: [chaos.kill(rank=1, at_step=4, phase="backward")],
    notes="The resume crashes before its first step, so liveness fails and quotes the KeyError; "
          "nothing else is judged. With the workaround every checker passes, the LR schedule "
          "included (lr_scheduler digest, loss continuity).",
)
