"""The agent's policy: the shared check (``federation.policy``) under the agent's settings name.

The agent enforces it in the inbox before creating anything (Rejected, reason ``PolicyViolation``,
naming each field), labels the namespaces it creates with the Pod Security level, and announces
the policy in its heartbeat so the dispatcher can skip a cluster that would refuse a Job.
"""

from __future__ import annotations

from federation.policy import LEVELS, Level, Policy, PolicySettings, Violation, describe, pod_specs

__all__ = ["LEVELS", "Level", "Policy", "PolicySettings", "Violation", "describe", "pod_specs"]
