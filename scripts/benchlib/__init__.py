"""What every benchmark under scripts/ shares: report (cells, tables, verdicts, versions), runner
(child processes, best-of timing, step records), measure (the matmul reference, op shares).
"""
