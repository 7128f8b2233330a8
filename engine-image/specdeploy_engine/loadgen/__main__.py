"""`python -m specdeploy_engine.loadgen`: see specdeploy_engine.loadgen.main."""

from specdeploy_engine.loadgen import main

raise SystemExit(main())
