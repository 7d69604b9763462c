"""``python -m infra.config``: print the table of every key; ``--write-docs`` updates
docs/configuration.md and the README (``make config-docs``)."""

import sys

from infra.config.tables import main

sys.exit(main(sys.argv[1:]))
