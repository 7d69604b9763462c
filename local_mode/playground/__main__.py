"""``python -m local_mode.playground`` (``make playground``)."""

from local_mode.playground.command_line import main

raise SystemExit(main())
