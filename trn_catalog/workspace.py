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
# "node" (kubeflow/trainer pkg/constants: Node).
TRAINER_CONTAINER = "node"
FSX_MOUNT = "/fsx"
DATASETS_MOUNT = "/datasets"
