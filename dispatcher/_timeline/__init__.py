"""The parts of `dispatcher.timeline`: its rows, and its drawings as text, as a picture and as a Chrome trace."""
