"""Evidence: receipts (content-addressed, hash-chained per pair), journals of runs in progress,
recovery of killed runs, derived records that reuse valid parts of failed runs.

    store = EvidenceStore(home.evidence)
    with store.begin(command="deploy", argv=sys.argv[1:], pair="lab", inputs={"pkg": sha}) as j:
        with j.step("upload", host="native") as step:
            step.data["bytes"] = n
        j.finish("passed", "deployed and verified")     # -> receipt hash
"""

from orchestrator.evidence.store import EvidenceBusy, EvidenceStore  # the package's entry point

__all__ = ["EvidenceBusy", "EvidenceStore"]
