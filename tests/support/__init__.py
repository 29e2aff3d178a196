"""What tests share: fakes, job scripts and servers. Test modules import from here (or get
fixtures from a conftest.py), never from one another."""
