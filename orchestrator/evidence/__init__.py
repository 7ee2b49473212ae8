"""Evidence: receipts (content-addressed, hash-chained per pair), journals of runs in progress,
recovery of killed runs, derived records that reuse valid parts of failed runs.

    store = EvidenceStore(home.evidence)
    with store.begin(command="deploy", argv=sys.argv[1:], pair="lab", inputs={"pkg": sha}) as j:
        with j.step("upload", host="native") as step:
            step.data["bytes"] = n
        j.finish("passed", "deployed and verified")     # -> receipt hash
"""

from orchestrator.evidence.journal import Journal, StepHandle
from orchestrator.evidence.masking import mask_argv, mask_data, mask_text
from orchestrator.evidence.receipt import OUTCOMES, Receipt, ReusedStep, StepRecord
from orchestrator.evidence.store import EvidenceBusy, EvidenceStore

__all__ = [
    "EvidenceBusy",
    "EvidenceStore",
    "Journal",
    "OUTCOMES",
    "Receipt",
    "ReusedStep",
    "StepHandle",
    "StepRecord",
    "mask_argv",
    "mask_data",
    "mask_text",
]
