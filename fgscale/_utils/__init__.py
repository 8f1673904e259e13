"""Private helpers that every layer of fgscale shares: files written atomically and locks
(:mod:`~fgscale._utils.files`), progress bars (:mod:`~fgscale._utils.progress`), package names
imported on first use (:mod:`~fgscale._utils.lazy`), the constraints of parameters
(:mod:`~fgscale._utils.constraints`) and the checkers of values that several layers take
(:mod:`~fgscale._utils.checks`)."""
