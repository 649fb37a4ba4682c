"""Results tooling: the comparison matrix (``compare``, on Ray: ``ray_executor``), its archive
(``run_archive``), paired statistics (``paired``), the update diagnostics (``update_stats``), the
report (``report``) and the reproduction check (``reproduce``). Programs over finished runs; the
training loop never imports them."""
