"""What every benchmark under scripts/ shares, so each script holds only its own job.

report  number cells, Markdown tables, target verdicts, the versions and processor a figure names
runner  child processes (wait4's peak RSS, a memory-watched tree), best-of timing, JSON results
        of a child, a run directory's step records
"""
