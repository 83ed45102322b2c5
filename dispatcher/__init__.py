"""Manager-cluster service: intake, placement, outbox, status mirror and the admin queries."""
