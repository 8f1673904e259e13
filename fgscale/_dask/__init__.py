"""Private plumbing between fgscale and Dask: the client, an embedded LocalCluster or a
running cluster joined (:mod:`~fgscale._dask.client`), the machine's cores
(:mod:`~fgscale._dask.cores`), the watch on a joined cluster's workers
(:mod:`~fgscale._dask.joined`), the dashboard's link (:mod:`~fgscale._dask.dashboard`) and the
signals of worker processes (:mod:`~fgscale._dask.worker_signals`). It imports neither torch nor
scikit-learn: conversion and bank workers run it."""
