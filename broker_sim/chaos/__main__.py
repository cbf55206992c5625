"""``python -m broker_sim.chaos broker ...``: one process broker of a chaos run (see ``processes``)."""

import sys

from broker_sim.chaos.processes import broker_main

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "broker":
        sys.exit(broker_main(sys.argv[2:]))
    print("usage: python -m broker_sim.chaos broker --id ID --zk HOSTS --root ROOT --journal PATH", file=sys.stderr)
    sys.exit(2)
