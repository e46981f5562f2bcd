"""Membership mode's public names; the policy lives in ``supervisor/policies/membership.py``."""
from pytest_reshard.supervisor.policies.membership import (LIGHTHOUSE_DEFAULTS, MemberGeneration,
                                                           Membership, check_scenario)

__all__ = ["Membership", "MemberGeneration", "check_scenario", "LIGHTHOUSE_DEFAULTS"]
