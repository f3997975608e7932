"""`python -m dispatcher.examples` runs the workspace server, like `-m dispatcher.examples.workspace`."""

from .workspace import main

if __name__ == "__main__":
    main()
