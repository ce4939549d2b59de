#!/usr/bin/env python3
"""The image's ENTRYPOINT: sets the job environment and runs torchrun (see trainer.launch)."""

from trainer.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
