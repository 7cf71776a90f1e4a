"""`nvrx-eks bench checkpoint`: the kit's tiered checkpointer (training/checkpoint/) measured on the
trainer's loop beside synchronous saves and NVRx's own checkpointing, and kill -9 trials of its tiers.

- bench.py: the rows and the report; benchstate.py: the state and step every row shares;
- nvrx_bench.py: NVRx's checkpointing on the same loop; torture.py: the kill -9 trials;
- commands.py: the subcommand.
"""
