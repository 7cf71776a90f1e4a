"""`nvrx-eks plan`: checkpoint intervals, spares and goodput for a fleet.

- `config`: the typed plan (YAML file + `key=value` overrides), with the published defaults it uses.
- `model`: the closed form (Young/Daly intervals, expected goodput per mode, Poisson spares).
- `shrink`: shrinking against waiting for a lost node's replacement, per replacement delay, through
  the model's node-loss cost.
- `simulate`: a seeded discrete-event simulation of the same run that checks the closed form.
- `calibrate`: the costs this kit measured (`--from RUN_DIR`), each labelled measured.
- `report`: the table, the JSON document and the PNG plots; `commands`: the CLI.

Layering: above k8s (it writes job values); it imports only kitcore.configio/kitcore.profiles,
training.* and k8s.*; nothing below imports it.
"""
