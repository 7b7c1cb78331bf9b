"""`python -m tepo_cli …` is the `tepo` console script (the deepspeed launcher starts it so)."""

from tepo_cli.cli import main

if __name__ == "__main__":
    main()
