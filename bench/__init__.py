"""What the kit measures or proves on this machine beside the demo: the benchmarks, which print ratios
measured side by side in one run, and the checks of one environment each.

- peer.py (`nvrx-eks bench peer`): the AWS sample's recovery experiment, mode by mode;
- scale.py (`bench scale`): recovery against node count; store.py (`bench store`): the rendezvous store
  under load; api.py (`bench api`): the public API's cost per step; checkpoint/ (`bench checkpoint`):
  the tiered checkpointer against synchronous saves and NVRx's own;
- gpu_check.py (`make gpu-check`), observe.py (`make observe-check`), image_check.py (`make
  image-check`): the GPU-only paths, the dashboards against a real Prometheus, the shipped images run
  as the pods run them.

Each runs the job through localrun/ (the executor, the chaos run, the run summary) and writes its
figures as JSON that `nvrx-eks plan --from` reads.
"""
