"""Test areas: the YAML files a repository declares its CI steps in, the run configuration,
AMD mirrors, the dependency-entry rule and the lint that loads fine but cannot mean what it says."""
