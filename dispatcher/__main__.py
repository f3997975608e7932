"""`python -m dispatcher COMMAND ...`: the same command line as the `dispatcher` console script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
