"""Stand-ins and fixtures the tests share (issue 36 item 5); test files import them."""
