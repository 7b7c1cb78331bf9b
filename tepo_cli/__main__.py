"""`python -m tepo_cli …` is the same as the `tepo` console script (used by the deepspeed launcher)."""

from tepo_cli.cli import main

if __name__ == "__main__":
    main()
