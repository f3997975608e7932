"""`python -m benchmarks [--quick] [--only NAME] [--repeat N]`."""

from ._cli import main

main()
