"""The controller loops: reconcile AppWrappers, run scheduling cycles, carry out decisions."""
