"""Any torch model as a workload graph (:class:`sim.spec.workload.Workload`): where the module
comes from (:mod:`.sources`), how it is traced on the meta device (:mod:`.trace`), and
torchvision beside a CPU build of torch (:mod:`.vision`)."""
