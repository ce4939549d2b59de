"""``python -m trainer``: the ``trn-train`` console script, for the image (no pip install there)."""

from trainer.cli import main

raise SystemExit(main())
