"""Running scenarios outside and inside pytest: ``Session`` (the runner), its reference runs, its
artifacts folder, and ``scenario_from`` (a checked Scenario from plain arguments)."""
from __future__ import annotations

from pytest_reshard.session.artifacts import OWNER_FILE, ArtifactsInUse, lock_artifacts, run_dir_of
from pytest_reshard.session.build import resolve_backend, scenario_from
from pytest_reshard.session.references import KILL_GRACE_S, concurrent_reference_ok, usable_cpus
from pytest_reshard.session.runner import Session

__all__ = ["Session", "scenario_from", "resolve_backend",
           "ArtifactsInUse", "lock_artifacts", "run_dir_of", "OWNER_FILE",
           "KILL_GRACE_S", "concurrent_reference_ok", "usable_cpus"]
