"""``python -m model_support.probe.devices DEVICE``: the device's facts as one JSON line (see
``resolve.facts``)."""

import sys

from .resolve import main

main(sys.argv[1:])
