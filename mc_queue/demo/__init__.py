"""Layer 10, the demos: ``mcq demo`` (a zombie worker refused), the agent factory under faults,
and the fleet of real processes they and the chaos run start."""
