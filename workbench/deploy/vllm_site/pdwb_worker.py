"""The workbench's extension of every vLLM worker (``--worker-extension-cls
pdwb_worker.WorkbenchExtension``), reached through vLLM's ``POST /collective_rpc`` (dev mode, on
loopback). vLLM mixes this class into its worker class, so method names carry a ``pdwb_`` prefix
to stay clear of the worker's own; each answers JSON-able values (vLLM passes arguments only as
strings)."""

import pdwb_amx


class WorkbenchExtension:
    """Read-only probes of one worker process."""

    def pdwb_amx_report(self) -> dict:
        """This worker's AMX tile permission, read without requesting it (``pdwb_amx.report``)."""
        return pdwb_amx.report()
