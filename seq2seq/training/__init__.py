"""Training machinery: the LightningModule, callbacks, optimizer and schedule, precision rule,
and checkpoint writing."""
