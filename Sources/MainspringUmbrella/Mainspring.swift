// `import Mainspring` gives the whole library: the loop and its I/O (MainspringCore), the seed
// patterns (MainspringPatterns) and the service group (MainspringServices). A dependent that
// wants one part imports (and compiles) only that module.
@_exported import MainspringCore
@_exported import MainspringPatterns
@_exported import MainspringServices
