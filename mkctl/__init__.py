"""The one command line: services, the demo, the simulator and the admin views."""
