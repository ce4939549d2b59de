"""Names in a deployed training workspace that both the CDK side and the ops CLI rely on.

``constructs_lib.workspace.TrainingWorkspace`` writes these into the cluster (the
``neuron-torch`` TrainingRuntime and its pod template); ``trnctl job`` and ``trnctl validate``
refer to them. Standard library only, so the CLI reads them without importing the CDK.
"""

from __future__ import annotations

TRAINER_API_GROUP = "trainer.kubeflow.org"
TRAINER_API_VERSION = "v1alpha1"
# The namespaced TrainingRuntime the workspace creates; TrainJobs reference it by name.
RUNTIME_NAME = "neuron-torch"
# Kubeflow Trainer's torch runtime names both the replicated job and the trainer container
# "node" (kubeflow/trainer v2.3.0 pkg/constants: Node): it fills in the container of that name and
# hands torchrun the rank-0 host <trainjob>-node-0-0.<trainjob>. trnctl selects a job's pods by
# the replicated job's name. The release's own value is in trn_catalog.crds.trainer_job().
TRAINER_CONTAINER = "node"
# The longest TrainJob name: a DNS-1035 label. JobSet names each pod's hostname
# <jobset>-<replicated job>-<job index>-<pod index>, itself a DNS label of at most 63
# characters; with the replicated job "node", job index 0 and up to 3 digits of pod index that
# leaves 63 - len("-node-0-999") = 52 characters for the name (derived, not a documented limit).
TRAINJOB_MAX_NAME = 63 - len(f"-{TRAINER_CONTAINER}-0-999")
# The label of the objects trnctl makes and manages (TrainJobs, pipelines' CronJobs).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The label that marks the runtime's trainer job (pkg/constants: LabelTrainJobAncestor,
# AncestorTrainer): only that job's pods get the TrainJob's image, node count and ranks.
TRAINER_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_ANCESTOR = "trainer"
FSX_MOUNT = "/fsx"
DATASETS_MOUNT = "/datasets"

# The GPU node group beside the trn nodes (context key gpu_instance_type): the node label both
# groups carry, each group's value of it, the GPU group's taint, and the namespaced
# TrainingRuntime that runs the same trainer on it with CUDA torch.
NODE_TYPE_LABEL = "trn-platform/node-type"
TRAINIUM_NODE_TYPE = "trainium"
GPU_NODE_TYPE = "gpu"
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
# The taint key the NVIDIA device plugin chart's own default tolerations name.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_RUNTIME_NAME = "cuda-torch"
# The GPU type a pod of the cuda-torch runtime runs on; TRN_INSTANCE_TYPE stays a trn type.
GPU_INSTANCE_TYPE_ENV = "TRN_GPU_INSTANCE_TYPE"
