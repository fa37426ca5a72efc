"""The engine loop: requests, scheduler, block manager, model runner, samplers and drafters."""
