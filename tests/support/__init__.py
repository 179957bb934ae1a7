"""What the tiers share: one gateway starter, one Redis, one fault upstream, one fake engine,
one clock, one metrics reader. Unit, integration, browser and bench tests all import from here;
no tier imports another tier's modules."""
