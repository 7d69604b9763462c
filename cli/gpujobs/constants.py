"""The vocabulary every ``gpujobs`` module shares: its name, the endpoint variable, the
jobs API's states and priority levels, the exit codes."""

from __future__ import annotations

PROG = "gpujobs"
ENDPOINT_ENV = "GPUJOBS_ENDPOINT"
POLL_ENV = "GPUJOBS_POLL_SECONDS"  # the default poll interval of watch and logs --follow

NON_TERMINAL_STATES = (
    "QUEUED", "PENDING_RESOURCES", "STARTING", "RUNNING", "PENDING_HEALTHCHECK",
    "PENDING_RESTART", "HELD", "NODE_LOST", "HUNG", "SUSPENDING", "SUSPENDED", "CANCELING",
)
TERMINAL_STATES = ("COMPLETE", "FAILED", "USER_STOPPED", "CANCELED")
FAILED_TERMINAL_STATES = frozenset(TERMINAL_STATES) - {"COMPLETE"}
PRIORITIES = ("LOW", "BELOW_NORMAL", "NORMAL", "ABOVE_NORMAL", "HIGH", "VERY_HIGH", "EXTREME_HIGH")
AUTO_PRIORITY = "AUTO"  # the server picks the highest level where the user's node quota has room

EXIT_OK, EXIT_JOB_FAILED, EXIT_CLIENT, EXIT_SERVER, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_WATCH_TIMEOUT = 124  # as timeout(1): the job had not ended when `watch --timeout` ran out
