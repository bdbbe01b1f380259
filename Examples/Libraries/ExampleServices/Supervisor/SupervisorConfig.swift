import Foundation

/// The supervisor's configuration file (JSON):
///
/// ```json
/// { "programs": [
///     { "name": "web", "command": ["/usr/bin/python3", "-m", "http.server", "8000"],
///       "restart": "always", "health": "http://127.0.0.1:8000/" },
///     { "name": "once", "command": ["/bin/echo", "hello"], "restart": "never" } ] }
/// ```
///
/// `restart`: `always` (the default), `on-failure` (an exit other than 0), `never`. `health`: a
/// URL checked every `healthInterval` seconds (default 2) with a GET; 2xx and 3xx are healthy.
/// `grace`: seconds between SIGTERM and SIGKILL when the program is stopped (default 5).
public struct SupervisorConfig: Decodable, Equatable, Sendable {
    /// One program to run.
    public struct Program: Decodable, Equatable, Sendable {
        /// When it is started again after it ends.
        public enum Restart: String, Decodable, Sendable { case always, onFailure = "on-failure", never }
        public var name: String
        public var command: [String]
        public var restart: Restart
        public var health: String?
        public var grace: Double

        public init(name: String, command: [String], restart: Restart = .always, health: String? = nil, grace: Double = 5) {
            self.name = name
            self.command = command
            self.restart = restart
            self.health = health
            self.grace = grace
        }

        enum CodingKeys: String, CodingKey { case name, command, restart, health, grace }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            command = try container.decode([String].self, forKey: .command)
            restart = try container.decodeIfPresent(Restart.self, forKey: .restart) ?? .always
            health = try container.decodeIfPresent(String.self, forKey: .health)
            grace = try container.decodeIfPresent(Double.self, forKey: .grace) ?? 5
            guard !command.isEmpty else {
                throw DecodingError.dataCorruptedError(forKey: .command, in: container, debugDescription: "empty command")
            }
        }
    }

    public var programs: [Program]
    public var healthInterval: Double?

    public init(programs: [Program], healthInterval: Double? = nil) {
        self.programs = programs
        self.healthInterval = healthInterval
    }

    /// Reads and checks the file; the error says what is wrong.
    public static func load(_ path: String) throws -> SupervisorConfig {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let config = try JSONDecoder().decode(SupervisorConfig.self, from: data)
        var names = Set<String>()
        for program in config.programs where !names.insert(program.name).inserted {
            throw ConfigError(message: "two programs named \(program.name)")
        }
        return config
    }
}

public struct ConfigError: Error, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}
