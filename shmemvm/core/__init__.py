"""The heap core: its state and services (state.py), how it is built (setup.py),
how new memory is shared as one transaction (sharing.py), and opt-in step timing
(profile.py)."""
