"""trnctl: the ops CLI for a deployed Trainium training platform."""
